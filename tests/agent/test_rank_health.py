"""A live agent flags the hung rank and the straggler from real ranks' multiprocess files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from stormwatch.agent.watch.events import RankExitEvent, read_agent_events
from stormwatch.agent.watch.procs import exit_status

#: A rank that steps every 50 ms, writing the trainer's per-step gauges and
#: collective counter. SLOW_RANK computes 3x longer while the others wait for it;
#: HANG_RANK stops stepping while the file HANG_FILE exists.
STEPPING_RANK = textwrap.dedent(
    """
    import os, signal, sys, time
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.environ["STORMWATCH_METRICS_DIR"]
    from prometheus_client import Counter, Gauge
    rank = int(os.environ["RANK"])
    lab = dict(training_job=os.environ["STORMWATCH_JOB"], rank=str(rank))
    live = dict(multiprocess_mode="livemax")
    names = ["training_job", "rank"]
    step = Gauge("stormwatch_train_step", "s", names, **live).labels(**lab)
    beat = Gauge("stormwatch_train_last_step_timestamp_seconds", "b", names, **live).labels(**lab)
    compute = Gauge("stormwatch_train_step_compute_seconds", "c", names, **live).labels(**lab)
    wait = Gauge("stormwatch_train_step_collective_wait_seconds", "w", names, **live).labels(**lab)
    calls = Counter("stormwatch_collective_calls", "n", names + ["op"])
    slow = rank == int(os.environ["SLOW_RANK"])
    hang_rank, hang_file = int(os.environ["HANG_RANK"]), os.environ["HANG_FILE"]
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    i = 0
    while True:
        if rank == hang_rank and os.path.exists(hang_file):
            time.sleep(0.02)
            continue
        i += 1
        time.sleep(0.05)
        calls.labels(op="all_reduce", **lab).inc()
        compute.set(0.3 if slow else 0.1)
        wait.set(0.01 if slow else 0.2)
        step.set(i)
        beat.set(time.time())
    """
)


def test_fc14_fc10_live_agent_flags_the_straggler_and_the_hung_rank(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    hang_file = tmp_path / "hang"
    dumps = tmp_path / "logs" / "dumps"
    dumps.mkdir(parents=True)
    (dumps / "rank1.json").write_text(json.dumps({"rank": 1, "reason": "test dump"}))
    agent = start_agent(hang_floor_seconds=2.0, hang_factor=10.0, straggler_samples=3)
    launcher = fake_torchrun(
        [0, 1, 2],
        env={"SLOW_RANK": "2", "HANG_RANK": "1", "HANG_FILE": str(hang_file)},
        rank_code=STEPPING_RANK,
        rank_args=["train", "--log-dir", str(tmp_path / "logs")],
    )
    job = launcher.job
    launcher.wait_pid(2)

    def straggler_flagged() -> Any:
        scrape = tools.scrape(agent.url)
        return (
            scrape
            if scrape.value("stormwatch_rank_straggler", training_job=job, rank="2")
            else None
        )

    scrape = tools.wait_for(straggler_flagged, timeout=30)
    for rank in "01":  # the ranks waiting for rank 2 are not stragglers
        assert scrape.value("stormwatch_rank_straggler", training_job=job, rank=rank) == 0
        score = scrape.value("stormwatch_rank_straggler_score", training_job=job, rank=rank)
        assert score is not None and score < 1.0
    score = scrape.value("stormwatch_rank_straggler_score", training_job=job, rank="2")
    assert score is not None and score >= 2.0
    assert scrape.value("stormwatch_rank_hung", training_job=job, rank="1") == 0
    assert scrape.value("stormwatch_rank_hangs_total", training_job=job, rank="1") == 0

    hang_file.touch()  # rank 1 stops completing steps (and collectives)

    def hung() -> Any:
        scrape = tools.scrape(agent.url)
        return scrape if scrape.value("stormwatch_rank_hung", training_job=job, rank="1") else None

    scrape = tools.wait_for(hung, timeout=30)
    assert scrape.value("stormwatch_rank_hung", training_job=job, rank="0") == 0
    assert scrape.value("stormwatch_rank_hung", training_job=job, rank="2") == 0
    assert scrape.value("stormwatch_rank_hangs_total", training_job=job, rank="1") == 1
    lags = {
        r: scrape.value("stormwatch_rank_collective_lag", training_job=job, rank=r) for r in "012"
    }
    assert max(lags, key=lambda r: lags[r] or 0) == "1", lags
    assert (lags["1"] or 0) > 0

    events = tools.http("GET", agent.url + f"/v1/events?job={job}").json()["events"]
    hang = next(e for e in events if e["kind"] == "rank_hang")
    assert hang["rank"] == 1 and hang["behind_rank"] == 1
    assert hang["pid"] == launcher.pids[1][0]
    assert any(e["kind"] == "rank_straggler" and e["rank"] == 2 for e in events)
    assert not any(e["kind"] == "rank_straggler" and e["rank"] != 2 for e in events)

    diagnostics = Path(hang["diagnostics"])
    assert diagnostics.parent.parent == agent.config.diagnostics_dir
    every = [diagnostics / f"rank{r}.txt" for r in (0, 1, 2)]  # written one rank after another
    report = tools.wait_for(lambda: all(f.exists() for f in every), timeout=30)
    assert report
    text = (diagnostics / "rank1.txt").read_text()
    assert "hung ranks: [1]" in text and "behind in the collective sequence: rank 1" in text
    assert "py-spy dump" in text or f"/proc/{launcher.pids[1][0]}/status" in text
    assert '"reason": "test dump"' in text

    hang_file.unlink()  # progress resumes: the episode ends, the counter stays

    def cleared() -> Any:
        scrape = tools.scrape(agent.url)
        return (
            scrape
            if scrape.value("stormwatch_rank_hung", training_job=job, rank="1") == 0
            else None
        )

    scrape = tools.wait_for(cleared, timeout=30)
    assert scrape.value("stormwatch_rank_hangs_total", training_job=job, rank="1") == 1

    launcher.stop()
    tools.wait_for(
        lambda: (
            len(
                [
                    e
                    for e in tools.http("GET", agent.url + "/v1/events?kind=rank_exit").json()[
                        "events"
                    ]
                    if e["job"] == job
                ]
            )
            == 3
        )
    )
    lines = read_agent_events(agent.config.events_file)
    kinds = [(e.kind, e.rank) for e in lines if e.job == job]
    assert ("rank_hang", 1) in kinds and ("rank_hang_cleared", 1) in kinds
    exits = [e for e in lines if e.job == job and isinstance(e, RankExitEvent)]
    assert all("exit_code" in e.to_record() and e.clean is False for e in exits)


def test_events_api_rejects_a_bad_since(start_agent: Any, tools: Any) -> None:
    agent = start_agent()
    reply = tools.http("GET", agent.url + "/v1/events?since=yesterday")
    assert reply.status == 400
    assert reply.json()["fields"][0]["field"] == "since"
    ok = tools.http("GET", agent.url + "/v1/events")
    assert ok.status == 200 and ok.json() == {"node": "node-test", "events": []}


@pytest.mark.parametrize(
    ("code", "expected"),
    [("raise SystemExit(3)", 3), ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9)],
)
def test_exit_status_is_read_from_a_zombie(code: str, expected: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while exit_status(proc.pid) is None:  # not reaped yet: a zombie once it ends
            assert time.monotonic() < deadline, "child never became a zombie"
            time.sleep(0.02)
        assert exit_status(proc.pid) == expected
    finally:
        assert proc.wait(30) == expected
    assert exit_status(proc.pid) is None  # reaped: nothing left to read
    assert exit_status(os.getpid()) is None  # running, not a zombie
