"""Lab jobs through Slurm (``LabConfig.scheduler`` ``slurm``): ``sbatch`` of
deploy/slurm/train.sbatch, one torchrun per node started by ``srun`` in the node's
namespace, control (find, state, cancel) through Slurm, in-job restarts by torchrun.

The Slurm lab is the one shared with the other modules of that shape (``slurm_lab``,
tests/slurm_lab.py; one rank per node: a job is rank 0 on node0 and rank 1 on node1); run
under ``/tmp/stormwatch-e2e.lock``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from stormwatch.chaos.target import LabJobs
from stormwatch.lab import JobSpec, Lab
from stormwatch.lab.jobs import slurmjob
from stormwatch.lab.state import JobInfo
from stormwatch.platforms import LabBackend, LabSlurmBackend, make_backend, read_lab_target
from stormwatch.platforms.lab_slurm import slurm_job_processes
from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands
from stormwatch.platforms.stopping import running
from stormwatch.telemetry.ranklogs import read_job_logs

pytestmark = [pytest.mark.e2e, pytest.mark.root]

#: A job's rank that ignores SIGTERM, rank 0 with a helper Slurm loses track of.
STUBBORN = Path(__file__).with_name("stubborn_rank.py")


@pytest.fixture
def lab(slurm_lab: Lab) -> Lab:
    """The shared Slurm lab of three nodes (its jobs on two, one rank each;
    tests/slurm_lab.py)."""
    return slurm_lab


def _slurm(lab: Lab) -> SlurmCommands:
    assert lab.state.slurm is not None
    return SlurmCommands(conf=lab.state.slurm.conf)


def test_a_job_is_submitted_with_sbatch_and_runs_one_torchrun_per_node(lab: Lab) -> None:
    started, submitted = time.monotonic(), time.time()
    info = lab.start_job(JobSpec(name="sb", steps=6, checkpoint_every=3))
    print(f"start_job (sbatch to every torchrun up): {time.monotonic() - started:.2f} s")
    assert info.slurm_job_id is not None
    assert set(info.node_pids) == {"node0", "node1"}  # the job's two nodes; node2 is spare
    [job] = _slurm(lab).jobs_named("sb")
    assert job.job_id == info.slurm_job_id and job.nodes == "node[0-1]"
    result = lab.wait_job("sb", timeout=600)
    assert result.ok, result.detail
    assert result.exit_codes == {"node0": 0, "node1": 0}
    logs = read_job_logs(Path(info.log_dir))
    assert sorted(logs) == [0, 1] and all(log.finished for log in logs.values())
    # one rank per node (node rank = SLURM_NODEID): each rank's done marker, written by
    # this job, is in its node's metrics folder
    for rank, node in ((0, "node0"), (1, "node1")):
        marker = Path(lab.state.node(node).metrics_dir) / f"rank{rank}.done"
        assert marker.stat().st_mtime >= submitted, (rank, node)
    assert all(Path(p).exists() for p in info.node_logs.values())
    assert _slurm(lab).job(info.slurm_job_id).state == "COMPLETED"
    assert _slurm(lab).nodes()["node2"].state == "IDLE"


def test_stop_job_cancels_it_through_slurm(lab: Lab) -> None:
    info = lab.start_job(JobSpec(name="cancel", steps=500, step_delay=0.5))
    result = lab.stop_job("cancel", grace=5.0)
    assert not result.ok
    assert all(code not in (None, 0) for code in result.exit_codes.values()), result
    assert info.slurm_job_id is not None
    assert _slurm(lab).job(info.slurm_job_id).state == "CANCELLED"
    assert slurmjob.torchruns(info.slurm_job_id) == {}


def test_a_killed_rank_is_restarted_by_torchrun_inside_the_slurm_job(lab: Lab) -> None:
    # Killed at step 6 or a little later (polled every 0.5 s), resumed from step 5: 14
    # steps leave the kill room to land before the job ends.
    info = lab.start_job(JobSpec(name="restart", steps=14, checkpoint_every=5, step_delay=0.2))
    log_dir = Path(info.log_dir)
    deadline = time.monotonic() + 300
    while True:
        logs = read_job_logs(log_dir)
        if 1 in logs and logs[1].last_step is not None and logs[1].last_step.step >= 6:
            break
        assert time.monotonic() < deadline, "rank 1 never reached step 6"
        time.sleep(0.5)
    os.kill(logs[1].starts[-1].pid, signal.SIGKILL)
    result = lab.wait_job("restart", timeout=600)
    assert result.ok, result.detail
    logs = read_job_logs(log_dir)
    assert logs[1].latest_attempt == 1 and logs[1].finished
    # rank 0, alone on node0, started again in the new rendezvous round of node1's restart
    assert len(logs[0].starts) >= 2 and logs[0].finished, logs[0].starts
    assert not psutil.pid_exists(info.node_pids["node0"])


def _stubborn_job(lab: Lab, name: str) -> tuple[JobInfo, list[dict[str, Any]]]:
    """Start a job of :data:`STUBBORN` ranks (one per node); its info and first run's
    records (rank 0's has its helper's pid)."""
    info = lab.start_job(JobSpec(name=name, command=(sys.executable, str(STUBBORN))))
    ranks = lab.state.config.world_size
    records = _poll(lambda: len(r := _stubborn_records(info)) == ranks and r, 30, "every rank")
    return info, records


def _stubborn_records(info: JobInfo) -> list[dict[str, Any]]:
    path = Path(info.log_dir) / "stubborn.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def _poll(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


class _Watch:
    """When each of ``pids`` was first seen gone (Unix s), polled every 50 ms in a thread."""

    def __init__(self, pids: list[int]) -> None:
        self.gone: dict[int, float] = {}
        self._procs = {pid: psutil.Process(pid) for pid in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for pid, proc in self._procs.items():
                if pid not in self.gone and not running(proc):
                    self.gone[pid] = time.time()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _untracked(caplog: pytest.LogCaptureFixture, pid: int) -> bool:
    """Whether the lab stopped ``pid`` as a process of a Slurm job that Slurm no longer
    tracked (so Slurm alone would have left it running)."""
    return any(
        "processes Slurm no longer tracked" in r.getMessage() and str(pid) in r.getMessage()
        for r in caplog.records
    )


def test_a_slurm_requeue_sigkills_what_ignores_sigterm_and_starts_the_job_only_once_it_is_gone(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    """The responder's restart of a Slurm job on the lab (its backend, from the lab's target
    file): Slurm SIGKILLs the ranks after KillWait (the lab's grace period); the helper
    Slurm lost track of is stopped by the lab before the job may start again; every old
    process is gone before the first rank of the next run starts."""
    info, records = _stubborn_job(lab, "stubborn-requeue")
    old = [r["pid"] for r in records] + [next(r["helper"] for r in records if r["rank"] == 0)]
    grace = lab.state.config.grace_period_s  # Slurm's KillWait, the responder's, lab stop's
    target = read_lab_target(lab.run_dir)
    assert target is not None and target.grace_period_s == grace
    diagnostics = lab.run_dir / "responder" / "diagnostics"
    slurm = make_backend("slurm", target.platform_settings(), diagnostics_dir=diagnostics)
    assert isinstance(slurm, SlurmBackend)
    backend = LabSlurmBackend(
        slurm=slurm, lab=LabBackend.for_lab(lab.run_dir, diagnostics_dir=diagnostics)
    )
    watch = _Watch(old)
    try:
        requeued = time.time()
        detail = backend.restart_workers("stubborn-requeue")
        print(f"requeue to RUNNING again: {time.time() - requeued:.1f} s")
        watch.close()
        fresh = _poll(
            lambda: [r for r in _stubborn_records(info) if r["restart"] == 1], 30, "the new run"
        )
    finally:
        watch.close()
        lab.stop_job("stubborn-requeue", grace=0)  # what is left: SIGKILL at once
    assert detail.startswith(f"requeued Slurm job {info.slurm_job_id} (stubborn-requeue): RUNNING")
    assert sorted(watch.gone) == sorted(old), "a process of the old run outlived the requeue"
    # SIGTERM did not stop them: they went only at the grace period (KillWait, then the lab).
    assert min(watch.gone.values()) >= requeued + grace - 0.5
    assert max(watch.gone.values()) < min(r["time"] for r in fresh)
    assert _untracked(caplog, old[-1])  # the helper: Slurm's requeue alone left it running


def test_a_chaos_run_stopping_its_job_returns_only_once_every_process_of_it_is_gone(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    """What a chaos run does with the job it started when it aborts or fails (its
    rollback's end, :class:`~stormwatch.chaos.target.LabJobs`): ``scancel``, Slurm's SIGKILL
    after KillWait, and the lab's own stop of what Slurm no longer tracks."""
    info, records = _stubborn_job(lab, "stubborn-stop")
    helper = next(r["helper"] for r in records if r["rank"] == 0)
    old = [psutil.Process(pid) for pid in [r["pid"] for r in records] + [helper]]
    started = time.monotonic()
    LabJobs(lab, world_size=lab.state.config.world_size).stop("stubborn-stop")
    took = time.monotonic() - started
    print(f"stop: {took:.1f} s")
    assert not [p.pid for p in old if running(p)], "a process of the job outlived its stop"
    assert slurm_job_processes(str(info.slurm_job_id)) == []
    assert took >= lab.state.config.grace_period_s  # Slurm's KillWait
    assert _untracked(caplog, helper)  # scancel alone left it running
    assert _slurm(lab).job(str(info.slurm_job_id)).state == "CANCELLED"
