"""End to end on the lab (FC-10): a hung rank is detected, the workers restarted, training
resumes from the last checkpoint, and the post-mortem names the hung rank.

Two nodes with one rank each (dp=2). Rank 1's control file arms ``collective_hang`` on its
next all-reduce: rank 1 never issues it, rank 0 waits inside it, no rank makes progress.
StormwatchTrainingHung fires (stall threshold 30 s + ``for: 30s``), Alertmanager notifies
the lab's responder, whose lab policy maps it to ``restart_workers``: the lab's jobs are
Slurm jobs, so ``scontrol requeue`` and start at once (Slurm's ``Restarts`` says so), and
the workers resume from the last checkpoint. The fault is
disarmed (file removed) once the responder acted, so the restarted rank 1 does not hang again. When
the alert resolves (the workers are down), the responder writes the post-mortem, and again
once the restarted workers completed a step; it must name rank 1 from the flight-recorder
dumps the workers wrote on SIGTERM (no chaos journal exists: only the evidence names it).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stormwatch.faults.control_file import control_path
from stormwatch.lab import JobSpec, Lab, LabConfig
from stormwatch.platforms.slurm import SlurmCommands
from stormwatch.telemetry.ranklogs import read_job_logs

pytestmark = [pytest.mark.e2e, pytest.mark.root]

JOB = "hang"
HUNG_RANK = 1
#: A one-block, 32-wide model (the trainer's ``--n-layers``/``--d-model``).
SMALL = ("--n-layers", "1", "--d-model", "32")
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config() -> LabConfig:
    ports = sorted({_free_port() for _ in range(3)})
    while len(ports) < 3:
        ports = sorted({*ports, _free_port()})
    return LabConfig(
        prefix="swhang",
        subnet=ipaddress.IPv4Network("10.216.0.0/24"),
        nodes=2,
        nproc_per_node=1,
        prometheus_port=ports[0],
        alertmanager_port=ports[1],
        responder_port=ports[2],
        rdzv_port=29510,
    )


def _print_tails(run_dir: Path) -> None:
    """The end of the job's and the responder's logs (shown when the test fails)."""
    for path in sorted(run_dir.glob("jobs/*/*.torchrun.log")) + sorted(run_dir.glob("logs/*")):
        lines = path.read_text(errors="replace").splitlines()[-25:]
        print(f"--- {path}\n" + "\n".join(lines))


@pytest.mark.timeout(900)
def test_hung_rank_is_restarted_by_the_responder_and_named_by_the_postmortem(
    tmp_path: Path, kit: Any, lab_responder: Callable[..., list[dict[str, Any]]]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab creates network namespaces")
    config = _config()
    lab = Lab(tmp_path / "run")
    try:
        lab.up(config)
        # 20 steps: the hang after step 7, the resume from step 5 (or 10) and a restarted
        # stretch of 10 steps or more before the end. The smallest model (half the CPU of
        # a step): the hang, not the model, is the subject.
        spec = JobSpec(name=JOB, steps=20, checkpoint_every=5, step_delay=0.2, extra_args=SMALL)
        info = lab.start_job(spec)
        logs_dir = Path(info.log_dir)

        def step_of(rank: int) -> int:
            logs = read_job_logs(logs_dir)
            last = logs[rank].last_step if rank in logs else None
            return last.step or 0 if last is not None else 0

        kit.wait_for(lambda: step_of(0) >= 7, 240, "the job to pass step 7 (checkpoint at 5)")
        control = Path(lab.state.node("node1").metrics_dir) / "control"
        control.mkdir(parents=True, exist_ok=True)
        hang = {"point": "collective_hang", "op": "all_reduce"}  # on any mesh dimension
        path = control_path(control, HUNG_RANK)
        path.write_text(json.dumps({"faults": [hang]}))
        armed_at = time.time()

        def stalled() -> bool:  # no rank completed a step for 5 s (steps take < 1 s)
            logs = read_job_logs(logs_dir)
            last = max((e.time for log in logs.values() for e in log.steps), default=0.0)
            running = not any(log.finished for log in logs.values())
            return running and last > armed_at - 5 and time.time() - last > 5

        kit.wait_for(stalled, 60, "rank 1 to hang in an all-reduce (no progress for 5 s)")

        [restart] = kit.wait_for(
            lambda: [
                a
                for a in lab_responder(lab, "actions")
                if a["kind"] == "restart_workers" and a["status"] in ("succeeded", "failed")
            ],
            180,
            "the responder to restart the workers",
        )
        # Disarm only now: removing the entry ends a hang (that is how a chaos revert ends
        # it), and the hung process must stay stuck until the responder's SIGTERM. Its
        # successor, still importing torch, reads the file after this.
        path.unlink()
        assert restart["status"] == "succeeded", restart
        assert restart["detail"].startswith(f"requeued Slurm job {info.slurm_job_id} "), restart
        assert lab.state.slurm is not None and info.slurm_job_id is not None
        slurm = SlurmCommands(conf=lab.state.slurm.conf)
        assert slurm.job(info.slurm_job_id).restarts == 1  # the restart went through Slurm
        result = lab.wait_job(JOB, timeout=300)
        assert result.exit_codes and all(c == 0 for c in result.exit_codes.values()), result

        pm_root = lab.paths.responder_dir / "postmortems"

        def hang_postmortem() -> dict[str, Any] | None:
            for path in pm_root.glob("incident-*/postmortem.json"):
                pm = json.loads(path.read_text())
                # Written when the alert resolves (the workers were down), again once
                # the restarted workers completed a step.
                hung = pm["alertname"] == "StormwatchTrainingHung" and pm["status"] == "closed"
                if hung and pm["recovered_at"] is not None:
                    return dict(pm)
            return None

        pm = kit.wait_for(hang_postmortem, 120, "the hang incident's post-mortem")
    except BaseException:
        _print_tails(tmp_path / "run")
        raise
    finally:
        lab.down(config)

    logs = read_job_logs(logs_dir)
    # A second start: ``attempt`` is torchrun's per-node restart count, not the job's.
    restarted = logs[0].starts[1:]
    assert restarted, "the workers were restarted"
    hung_at_step = max(e.step or 0 for e in logs[0].steps if e.time < restarted[0].time)
    resumed = restarted[0].resumed_from_step
    assert resumed is not None and resumed >= 5 and resumed % 5 == 0 and resumed <= hung_at_step
    assert logs[0].finished and logs[1].finished

    culprit = pm["culprit"]
    assert (culprit["rank"], culprit["node"]) == (HUNG_RANK, "node1"), culprit
    assert culprit["method"] == "flight_recorder" and culprit["certain"], culprit
    assert culprit["chaos_fault_rank"] is None  # no journal: the dumps alone named it
    assert pm["impact"]["resumed_from_step"] == resumed
    assert pm["impact"]["steps_lost"] == hung_at_step - resumed
    assert pm["time_to_detect_seconds"] is not None and pm["time_to_recover_seconds"] is not None
    assert any(a.startswith("restart_workers: succeeded") for a in pm["actions"])
    assert [p["source"] for p in pm["plots"]] == ["prometheus"] * 3  # the lab's Prometheus
    folder = pm_root / f"incident-{pm['incident_id']}"
    assert (folder / "postmortem.html").stat().st_size > 10_000
    ARTIFACTS.mkdir(parents=True, exist_ok=True)  # the real lab's report, for a reader
    shutil.copy(folder / "postmortem.html", ARTIFACTS / "hung-rank-postmortem.html")
    print(f"\nhung-rank post-mortem: {pm['summary']}")
