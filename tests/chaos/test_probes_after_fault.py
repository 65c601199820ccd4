"""Job probes after a fault: a finished job does not count as recovered; details stay short."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from stormwatch.chaos import AttachedJobs
from stormwatch.chaos.execution.probes import ProbeContext, check, rank_spans
from stormwatch.chaos.experiment.model import JobProvider
from stormwatch.contracts.journal import JobRef

T0 = 1_700_000_000.0


def _write_logs(log_dir: Path, ranks: int, steps: int, *, done: bool) -> None:
    log_dir.mkdir(parents=True)
    for rank in range(ranks):
        events = [{"event": "start", "time": T0, "rank": rank, "attempt": 0}]
        events += [
            {"event": "step", "time": T0 + s, "step": s, "loss": 1.0, "attempt": 0}
            for s in range(1, steps + 1)
        ]
        if done:
            events.append({"event": "done", "time": T0 + steps + 0.1, "step": steps})
        (log_dir / f"rank{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def _ctx(run_dir: Path, *, since: float | None, now: float) -> ProbeContext:
    job = JobRef(
        name="j", log_dir=run_dir / "jobs" / "j" / "logs", world_size=4, started_by_runner=False
    )
    return ProbeContext(
        job=job,
        jobs=AttachedJobs(run_dir, world_size=4),
        prometheus=None,
        variables={},
        since=since,
        clock=lambda: now,
    )


def test_ranks_that_finished_before_the_fault_are_not_progressing_after_it(
    tmp_path: Path,
) -> None:
    # The re-run bug: the job had finished (step 50) when the kill landed; "progressing"
    # after the fault passed because finished ranks counted, whatever the fault's time.
    _write_logs(tmp_path / "jobs" / "j" / "logs", 4, 50, done=True)
    provider = JobProvider(type="job", expect="progressing", window_seconds=15)

    after = asyncio.run(check(provider, _ctx(tmp_path, since=T0 + 55, now=T0 + 56)))
    assert not after.ok and after.terminal
    assert "ranks 0-3 had finished before the fault (at step 50)" in after.detail

    # Finishing *after* the fault is recovery; without a fault a finished job progresses.
    assert asyncio.run(check(provider, _ctx(tmp_path, since=T0 + 40, now=T0 + 56))).ok
    assert asyncio.run(check(provider, _ctx(tmp_path, since=None, now=T0 + 56))).ok


def test_lagging_ranks_are_summarised_on_one_short_line(tmp_path: Path) -> None:
    _write_logs(tmp_path / "jobs" / "j" / "logs", 4, 25, done=False)
    provider = JobProvider(type="job", expect="progressing", window_seconds=1)

    outcome = asyncio.run(check(provider, _ctx(tmp_path, since=None, now=T0 + 28.1)))

    assert not outcome.ok
    assert outcome.detail == "ranks 0-3 at step 25, last step 3.1 s ago"
    assert rank_spans([1]) == "rank 1" and rank_spans([0, 2, 3, 5]) == "ranks 0, 2-3, 5"


def test_an_elastic_job_that_shrank_is_progressing_with_the_ranks_of_its_latest_rendezvous(
    tmp_path: Path,
) -> None:
    """Node 1 (ranks 2-3) lost at step 25: ranks 0-1 restart at world size 2 and go on; the
    stale logs of ranks 2-3 must not count, nor the job's original world size of 4."""
    log_dir = tmp_path / "jobs" / "j" / "logs"
    log_dir.mkdir(parents=True)
    provider = JobProvider(type="job", expect="progressing", window_seconds=5)

    def append(rank: int, events: list[dict[str, object]]) -> None:
        with (log_dir / f"rank{rank}.jsonl").open("a") as fh:
            fh.write("".join(json.dumps(e) + "\n" for e in events))

    for rank in range(4):
        append(rank, [{"event": "start", "time": T0, "rank": rank, "attempt": 0, "world_size": 4}])
        append(
            rank,
            [
                {"event": "step", "time": T0 + s, "step": s, "loss": 1.0, "attempt": 0}
                for s in range(1, 26)
            ],
        )
    stalled = asyncio.run(check(provider, _ctx(tmp_path, since=T0 + 25.5, now=T0 + 29)))
    assert not stalled.ok and stalled.detail == "ranks 0-3 at step 25, last step 4.0 s ago"

    for rank in (0, 1):
        append(
            rank,
            [{"event": "start", "time": T0 + 30, "rank": rank, "attempt": 1, "world_size": 2}]
            + [
                {"event": "step", "time": T0 + 30 + s, "step": 20 + s, "loss": 1.0, "attempt": 1}
                for s in range(1, 11)
            ],
        )
    outcome = asyncio.run(check(provider, _ctx(tmp_path, since=T0 + 25.5, now=T0 + 41)))

    assert outcome.ok, outcome.detail
    assert outcome.detail == "all 2 ranks progressing"
