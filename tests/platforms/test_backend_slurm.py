"""The slurm backend's command lines, recorded through its runner seam, and the real
runner against real programs (a missing one, a failing one)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from stormwatch.platforms import BackendError
from stormwatch.platforms.slurm import SlurmBackend, run_command

SQUEUE = ["squeue", "--noheader", "--name=llm", "--states=RUNNING", "--format=%i|%N"]


class Slurm:
    """Answers squeue/scontrol like a cluster running job 4242 (``llm``) on two nodes."""

    def __init__(self, running: str = "4242|gpu-[07-08]\n") -> None:
        self.running = running
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "squeue" and "--steps" not in argv:
            return self.running
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            assert argv[3] == "gpu-[07-08]"
            return "gpu-07\ngpu-08\n"
        if argv[:4] == ["scontrol", "--details", "show", "job"]:
            return "JobId=4242 JobName=llm JobState=RUNNING\n"
        return ""

    def actions(self) -> list[list[str]]:
        """The calls that change something (not squeue, not scontrol show)."""
        return [c for c in self.calls if c[0] != "squeue" and c[1] != "show"]


def _backend(slurm: Slurm, tmp_path: Path, **extra: object) -> SlurmBackend:
    return SlurmBackend(
        diagnostics_dir=tmp_path / "diag",
        nproc_per_node=4,
        runner=slurm,
        clock=lambda: 7.0,
        **extra,  # type: ignore[arg-type]
    )


def test_ranks_follow_the_node_order_of_the_allocation(tmp_path: Path) -> None:
    slurm = Slurm()
    placement = _backend(slurm, tmp_path).ranks("llm")
    assert placement == {r: "gpu-07" for r in range(4)} | {r: "gpu-08" for r in range(4, 8)}
    assert slurm.calls[0] == SQUEUE


def test_restart_requeues_the_job(tmp_path: Path) -> None:
    slurm = Slurm()
    assert _backend(slurm, tmp_path).restart_workers("llm") == "requeued Slurm job 4242 (llm)"
    assert slurm.actions() == [["scontrol", "requeue", "4242"]]


def test_exclude_node_drains_it_with_a_reason_then_requeues(tmp_path: Path) -> None:
    slurm = Slurm()
    _backend(slurm, tmp_path).exclude_node_and_restart("llm", "gpu-08")
    assert slurm.actions() == [
        [
            "scontrol",
            "update",
            "NodeName=gpu-08",
            "State=DRAIN",
            "Reason=stormwatch: excluded from job llm (4242)",
        ],
        ["scontrol", "requeue", "4242"],
    ]


def test_a_node_outside_the_allocation_is_not_drained(tmp_path: Path) -> None:
    slurm = Slurm()
    with pytest.raises(BackendError, match="no live worker on node 'gpu-99'"):
        _backend(slurm, tmp_path).exclude_node_and_restart("llm", "gpu-99")
    assert slurm.actions() == []


def test_no_running_job_and_two_running_jobs_are_errors(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="no live worker of job 'llm'"):
        _backend(Slurm(running=""), tmp_path).restart_workers("llm")
    with pytest.raises(BackendError, match=r"several running Slurm jobs \(1, 2\)"):
        _backend(Slurm(running="1|a\n2|b\n"), tmp_path).restart_workers("llm")


def test_checkpoint_goes_to_the_control_file_on_the_shared_filesystem(tmp_path: Path) -> None:
    control = str(tmp_path / "{job}-{jobid}" / "control")
    _backend(Slurm(), tmp_path, control_dir=control).request_checkpoint("llm")
    armed = json.loads((tmp_path / "llm-4242" / "control" / "rank0.json").read_text())
    assert armed == {"faults": [{"point": "checkpoint_now", "requested_at": 7.0}]}


def test_diagnostics_keep_scontrol_show_job_and_the_steps(tmp_path: Path) -> None:
    slurm = Slurm()
    _backend(slurm, tmp_path).collect_diagnostics("llm", 3)
    report = json.loads((tmp_path / "diag" / "incident-3.json").read_text())
    assert report["job_id"] == "4242" and report["nodes"] == ["gpu-07", "gpu-08"]
    assert report["scontrol_show_job"].startswith("JobId=4242")
    assert ["scontrol", "--details", "show", "job", "4242"] in slurm.calls
    assert ["squeue", "--steps", "--jobs=4242"] in slurm.calls


def test_the_real_runner_reports_a_missing_program_and_a_failure() -> None:
    with pytest.raises(BackendError, match="squeue-not-installed: not found"):
        run_command(["squeue-not-installed"])
    with pytest.raises(BackendError, match="exit status 3: boom"):
        run_command(["sh", "-c", "echo boom >&2; exit 3"])
    assert run_command(["echo", "4242|n1"]) == "4242|n1\n"
