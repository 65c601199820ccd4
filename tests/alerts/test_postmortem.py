"""Incident post-mortems: written by the responder when an incident resolves, re-rendered by
``stormwatch alerts postmortem``, and rendered by a real browser (headless Chromium).

The lab run directory here holds files in the trainer's and agent's documented formats
(rank logs, flight-recorder dumps, spans, agent events): a 4-rank job whose rank 2 never
joined a collective, restarted from the step-15 checkpoint. The real lab version is
tests/telemetry/integrations/test_lightning_lab.py (a hung Lightning job on the Slurm lab).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stormwatch.lab import Lab
from stormwatch.lab.config import LabConfig
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import StateStore, plan_state

JOB = "train"
GROUP_KEY = '{}:{alertname="StormwatchTrainingHung", training_job="train"}'
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _dump(rank: int, at: float, *, behind: bool) -> dict[str, Any]:
    """A trainer dump (telemetry/dump.py): rank 2 enqueued one collective fewer and waits in none."""
    seq = 226 if behind else 227
    return {
        "rank": rank,
        "attempt": 0,
        "pid": 1000 + rank,
        "time": at,
        "reason": "Terminated" if behind else "RuntimeError: Connection closed by peer",
        "step": 21,
        "flight_recorder": {
            "pg_status": {
                "0": {"last_enqueued_collective": "55", "last_completed_collective": "-1"},
                "2": {"last_enqueued_collective": str(seq), "last_completed_collective": "-1"},
            },
            # the ring's latest entry on group index 2 names it (the same group on every rank)
            "entries": [
                {"pg_id": 2, "process_group": ["3", "mesh_dp_shard"], "collective_seq_id": seq}
            ],
        },
        "flight_recorder_error": None,
        "collectives": [
            {
                "seq": seq,
                "op": "all_reduce",
                "mesh_dim": "dp",
                "issued_at": at - 60,
                "seconds": 0.01 if behind else None,
            }
        ],
    }


def make_lab_run(run_dir: Path, last_step_at: float) -> None:
    """Steps 1..20 every second up to ``last_step_at``, a hang, a restart 70 s later from
    step 15, steps 16..30 again; dumps at the restart; agent hang events; one span."""
    paths = RunPaths.of(run_dir)
    # A lab that runs no Slurm: with Slurm, its target file names a slurm.conf whose
    # slurmctld does not run here, and every post-mortem waited out `scontrol`'s 30 s
    # timeout for Slurm's job history.
    state = plan_state(paths, LabConfig(nodes=2, nproc_per_node=2, slurm=False))
    state.prometheus_url = ""  # no Prometheus in this lab: the plots come from the rank logs
    StateStore(paths).save(state)  # lab.json as `lab up` writes it: node0, node1, 2 ranks each
    Lab(run_dir)._write_target_file(state)  # and its target file, which post-mortems read
    logs = run_dir / "jobs" / JOB / "logs"
    t0 = last_step_at - 20
    restart = last_step_at + 70
    for rank in range(4):
        rows: list[dict[str, Any]] = [
            {"event": "start", "time": t0 - 1, "rank": rank, "attempt": 0,
             "resumed_from_step": None}
        ]  # fmt: skip
        rows += [
            {"event": "step", "time": t0 + s, "step": s, "loss": 5.0 - s / 10, "attempt": 0,
             "step_seconds": 0.4 + 0.01 * rank}
            for s in range(1, 21)
        ]  # fmt: skip
        rows.append({"event": "start", "time": restart, "rank": rank, "attempt": 1,
                     "resumed_from_step": 15})  # fmt: skip
        rows += [
            {"event": "step", "time": restart + 5 + (s - 16), "step": s, "loss": 5.0 - s / 10,
             "attempt": 1, "step_seconds": 0.4}
            for s in range(16, 31)
        ]  # fmt: skip
        _jsonl(logs / f"rank{rank}.jsonl", rows)
        dump = _dump(rank, restart - 2, behind=rank == 2)
        (logs / "dumps").mkdir(parents=True, exist_ok=True)
        (logs / "dumps" / f"rank{rank}.json").write_text(json.dumps(dump))
    start = dt.datetime.fromtimestamp(restart + 1, dt.UTC).isoformat()
    end = dt.datetime.fromtimestamp(restart + 3, dt.UTC).isoformat()
    _jsonl(logs / "spans" / "rank0.jsonl", [
        {"name": "checkpoint_load", "start_time": start, "end_time": end,
         "status": {"status_code": "UNSET"}, "attributes": {"step": 20},
         "resource": {"attributes": {"rank": 0, "job": JOB}}}
    ])  # fmt: skip
    _jsonl(run_dir / "nodes" / "node1" / "agent" / "events.jsonl", [
        {"time": last_step_at + 31, "node": "node1", "kind": "rank_hang", "job": JOB, "rank": r}
        for r in (2, 3)
    ])  # fmt: skip


def _alert(kit: Any, status: str, starts_at: float, ends_at: float | None) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {
            "alertname": "StormwatchTrainingHung",
            "training_job": JOB,
            "severity": "critical",
        },
        "annotations": {"summary": "Job train is hung"},
        "startsAt": kit.iso(starts_at),
        "endsAt": kit.iso(ends_at) if ends_at is not None else "0001-01-01T00:00:00Z",
        "generatorURL": "http://127.0.0.1:19090/graph",
        "fingerprint": "7a1c0de5e1f00d01",
    }


def _hang_payload(kit: Any, status: str, last_step_at: float) -> dict[str, Any]:
    ends_at = last_step_at + 80 if status == "resolved" else None
    payload = kit.payload(_alert(kit, status, last_step_at + 60, ends_at), group_key=GROUP_KEY)
    payload["groupLabels"] = payload["commonLabels"] = {
        "alertname": "StormwatchTrainingHung",
        "training_job": JOB,
    }
    return payload


@pytest.fixture(scope="module")
def resolved_incident(
    tmp_path_factory: pytest.TempPathFactory, kit: Any
) -> Iterator[tuple[Any, Path, Path]]:
    """A responder with a lab run dir whose hang incident opened and resolved, shared by the
    module's tests; yields (responder, run dir, post-mortem folder)."""
    tmp_path = tmp_path_factory.mktemp("postmortem")
    last_step_at = time.time() - 100
    run_dir = tmp_path / "run"
    make_lab_run(run_dir, last_step_at)
    pm_dir = tmp_path / "postmortems"
    token = secrets.token_urlsafe(32)
    (tmp_path / "responder.token").write_text(token + "\n")
    responder = kit.responder_process(
        db=tmp_path / "responder.sqlite",
        token=token,
        token_file=tmp_path / "responder.token",
        log=tmp_path / "responder.log",
        args=("--lab-run-dir", str(run_dir), "--postmortem-dir", str(pm_dir)),
    ).start()
    try:
        assert responder.post(_hang_payload(kit, "firing", last_step_at)).status == 200
        reply = responder.post(_hang_payload(kit, "resolved", last_step_at))
        assert reply.status == 200 and reply.body["incidents_closed"] == [1], reply
        folder = pm_dir / "incident-1"
        kit.wait_for(
            lambda: (folder / "postmortem.html").exists(), 60, "the post-mortem to be written"
        )
        yield responder, run_dir, folder
    finally:
        responder.stop(signal.SIGKILL)


def test_a_resolved_incident_gets_a_postmortem_naming_the_rank_that_never_joined(
    resolved_incident: tuple[Any, Path, Path],
) -> None:
    _, _, folder = resolved_incident
    pm = json.loads((folder / "postmortem.json").read_text())
    culprit = pm["culprit"]
    assert (culprit["rank"], culprit["node"], culprit["method"]) == (2, "node1", "flight_recorder")
    assert culprit["certain"] is True
    assert pm["onset_source"] == "last progress"
    assert pm["time_to_detect_seconds"] == pytest.approx(60, abs=0.01)
    assert pm["time_to_recover_seconds"] == pytest.approx(75, abs=0.01)
    impact = pm["impact"]
    assert (impact["world_size"], impact["last_step_before"], impact["resumed_from_step"]) == (
        4,
        20,
        15,
    )
    assert impact["steps_lost"] == 5
    # onset -> step 20 completed again: restart + 5 s + 4 steps = 79 s; 4 ranks hold a GPU each.
    assert impact["time_lost_seconds"] == pytest.approx(79, abs=0.01)
    assert impact["gpu_hours_lost"] == pytest.approx(4 * 79 / 3600, rel=1e-6)
    assert 0 < impact["goodput"] < 0.2
    sources = {row["source"] for row in pm["timeline"]}
    assert {"prometheus", "responder", "rank logs", "trainer", "agent node1"} <= sources
    assert "trace rank 0" in sources  # the checkpoint_load span, with its step
    assert "trace: checkpoint_load of step 20 (span)" in {row["event"] for row in pm["timeline"]}
    assert [p["source"] for p in pm["plots"]] == ["rank logs"] * 3
    markdown = (folder / "postmortem.md").read_text()
    assert "likely culprit | rank 2 / node1" in markdown
    assert "![Per-rank heartbeats" in markdown
    # the headline and the table give the same figure (fresh-user pass: 0.014 beside 0.0143)
    assert "; 0.0878 GPU-hours lost." in markdown and "| 0.0878 (4 ranks) |" in markdown
    # Each figure says what it measures (fresh-user pass: 11.1 s lost beside a 9.3 s recovery)
    assert "| time lost (onset → the job back at its last step before the restart) | 79" in (
        markdown
    )
    assert "goodput during the incident (new steps x median step interval / onset → close)" in (
        markdown
    )
    page = (folder / "postmortem.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3
    assert "http://" not in page.replace("http://127.0.0.1:19090/graph", "")


def test_postmortem_command_rerenders_and_names_an_unknown_incident(
    resolved_incident: tuple[Any, Path, Path],
    kit: Any,
    tmp_path: Path,
    stormwatch: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    responder, run_dir, _ = resolved_incident
    out = tmp_path / "again"
    done = subprocess.run(
        [kit.stormwatch, "alerts", "postmortem", "1", "--db", str(responder.db),
         "--lab-run-dir", str(run_dir), "-o", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "likely culprit rank 2 on node1" in done.stdout
    assert json.loads((out / "incident-1" / "postmortem.json").read_text())["culprit"]["rank"] == 2

    unknown = stormwatch("alerts", "postmortem", "99", "--db", str(responder.db))
    assert unknown.returncode != 0
    assert "no incident 99" in unknown.stderr and "incidents: 1..1" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_the_html_postmortem_renders_its_plots_in_headless_chromium_without_errors(
    resolved_incident: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(chromium):
        pytest.skip("Debian's chromium is not installed (make system installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e .[dev]")
    _, _, folder = resolved_incident
    problems: list[str] = []
    shot = tmp_path / "postmortem.png"
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on(
                "console",
                lambda m: (
                    problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning")
                    else None
                ),
            )
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.on(
                "request",
                lambda r: (
                    problems.append(f"external request: {r.url}")
                    if not r.url.startswith(("file:", "data:"))
                    else None
                ),
            )
            page.goto((folder / "postmortem.html").as_uri(), wait_until="load")
            sizes = page.eval_on_selector_all(
                "img[data-plot]",
                "imgs => imgs.map(i => [i.dataset.plot, i.complete, i.naturalWidth])",
            )
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "incident-postmortem.png")
    assert problems == []
    assert [s[0] for s in sizes] == ["step_time", "throughput", "heartbeats"]
    assert all(complete and width >= 800 for _, complete, width in sizes), sizes
    assert shot.stat().st_size > 10_000


def test_a_rank_killed_without_a_dump_is_named_and_not_a_survivor_behind_it(
    resolved_incident: tuple[Any, Path, Path],
    tmp_path: Path,
    stormwatch: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    # Like the kill-rank demo's real dumps: rank 2 SIGKILLed (no dump), its peer rank 3
    # failed before issuing its next collective, so rank 3 looks behind and idle.
    responder, run_dir, folder = resolved_incident
    onset = json.loads((folder / "postmortem.json").read_text())["onset_at"]
    killed = tmp_path / "run"
    shutil.copytree(run_dir, killed)
    dumps = killed / "jobs" / JOB / "logs" / "dumps"
    (dumps / "rank2.json").unlink()
    (dumps / "rank3.json").write_text(json.dumps(_dump(3, onset + 68, behind=True)))
    _jsonl(killed / "nodes" / "node1" / "agent" / "events.jsonl", [
        {"time": onset + 0.5, "node": "node1", "kind": "rank_exit", "job": JOB, "rank": 2,
         "clean": False, "exit_code": -9}
    ])  # fmt: skip
    done = stormwatch("alerts", "postmortem", "1", "--db", str(responder.db),
                       "--lab-run-dir", str(killed), "-o", str(tmp_path / "pm"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    culprit = json.loads((tmp_path / "pm" / "incident-1" / "postmortem.json").read_text())[
        "culprit"
    ]
    assert (culprit["rank"], culprit["method"]) == (2, "rank_exit"), culprit
    assert "flight recorder not compared: rank(s) 2 wrote no dump" in culprit["evidence"]


@pytest.mark.parametrize(
    ("event", "words"),
    [
        ({"exit_code": -9, "exit_signal": "SIGKILL"}, "was killed by SIGKILL"),
        ({"exit_code": -15}, "was killed by SIGTERM"),
        ({"exit_code": 143}, "exited with code 143 (128 + SIGTERM: the process ended itself"),
        ({"exit_code": 1}, "exited with code 1"),
        ({"exit_code": None, "reason": "unknown"}, "exited (status unknown: the agent saw no"),
    ],
)
def test_a_rank_exit_is_told_in_words_not_raw_codes(event: dict[str, object], words: str) -> None:
    from stormwatch.agent.watch.events import RankExitEvent
    from stormwatch.alerts.incident_report.clues import exit_status

    exited = RankExitEvent.model_validate(
        {"time": 1.0, "node": "n", "job": JOB, "rank": 0, **event}
    )
    assert exit_status(exited).startswith(words)
