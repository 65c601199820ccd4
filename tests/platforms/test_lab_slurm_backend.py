"""The Slurm lab's backend: a job slurmctld holds goes through Slurm; a job the lab launched
directly (elastic, custom entrypoint: Slurm does not know it) goes to its processes, and the
answer says so; a job neither knows is Slurm's clear error, never a silent no-op.

Slurm answers through the command client's runner seam (a cluster whose jobs are a table);
the direct job's workers are real processes with a rank's environment (``fake_job``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from stormwatch.platforms import BackendError, LabBackend, LabSlurmBackend
from stormwatch.platforms.lab_slurm import DIRECT_NOTE
from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands


class Jobs:
    """``scontrol --oneliner show job`` and ``squeue --name`` of a cluster whose jobs are
    ``{name: state}`` (job ids from 100), each on node[0-1]."""

    def __init__(self, **jobs: str) -> None:
        self.jobs = jobs
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        rows = [(str(100 + i), n, s) for i, (n, s) in enumerate(self.jobs.items())]
        if list(argv[:4]) == ["scontrol", "--oneliner", "show", "job"]:
            return "".join(
                f"JobId={i} JobName={n} JobState={s} NodeList=node[0-1]\n" for i, n, s in rows
            )
        if argv[0] == "squeue":
            name = next(a for a in argv if a.startswith("--name=")).removeprefix("--name=")
            return "".join(f"{i}|node[0-1]\n" for i, n, s in rows if n == name and s == "RUNNING")
        if list(argv[:3]) == ["scontrol", "show", "hostnames"]:
            return "node0\nnode1\n"
        raise AssertionError(f"unexpected command {argv}")


@pytest.fixture
def nodes(tmp_path: Path) -> dict[str, Path]:
    """Two lab nodes' metrics directories (a worker's node is the one its environment names)."""
    found = {n: tmp_path / n / "metrics" for n in ("node0", "node1")}
    for folder in found.values():
        folder.mkdir(parents=True)
    return found


def _backend(slurm: Jobs, tmp_path: Path, nodes: dict[str, Path]) -> LabSlurmBackend:
    return LabSlurmBackend(
        slurm=SlurmBackend(
            diagnostics_dir=tmp_path / "diag",
            nproc_per_node=2,
            commands=SlurmCommands(runner=slurm),
        ),
        lab=LabBackend(
            diagnostics_dir=tmp_path / "diag", node_metrics_dirs=nodes, grace_period_s=1
        ),
    )


def test_a_job_slurm_holds_is_placed_and_acted_on_through_slurm(
    tmp_path: Path, nodes: dict[str, Path]
) -> None:
    slurm = Jobs(train="RUNNING", old="COMPLETED")
    backend = _backend(slurm, tmp_path, nodes)
    assert backend.is_slurm_job("train") and not backend.is_slurm_job("old")
    assert backend.ranks("train") == {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
    assert ["squeue", "--noheader", "--name=train", "--states=RUNNING", "--format=%i|%N"] in (
        slurm.calls
    )


def test_a_job_the_lab_launched_directly_goes_to_its_processes_and_says_so(
    tmp_path: Path, nodes: dict[str, Path], fake_job: Any, kit: Any
) -> None:
    slurm = Jobs(elastic="COMPLETED")  # an earlier Slurm job of that name has ended
    node0 = fake_job("elastic", nodes["node0"], workers=2, first_rank=0)
    fake_job("elastic", nodes["node1"], workers=2, first_rank=2)
    # Another lab on this machine runs a job of the same name: not this lab's to signal.
    elsewhere = tmp_path / "another-lab" / "node0"
    elsewhere.mkdir(parents=True)
    other = fake_job("elastic", elsewhere, workers=2, first_rank=0)
    backend = _backend(slurm, tmp_path, nodes)
    assert backend.ranks("elastic") == {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
    detail = backend.restart_workers("elastic")
    assert detail.startswith(DIRECT_NOTE + "sent SIGTERM to 4 workers of job elastic")
    kit.wait_for(lambda: node0.terms("worker") == 2, 10, "SIGTERM to node0's workers")
    assert other.terms("worker") == 0


def test_a_job_neither_slurm_nor_the_lab_runs_is_slurms_clear_error(
    tmp_path: Path, nodes: dict[str, Path]
) -> None:
    backend = _backend(Jobs(), tmp_path, nodes)
    with pytest.raises(BackendError, match="no running Slurm job"):
        backend.restart_workers("ghost")
    with pytest.raises(BackendError, match="no running Slurm job"):
        backend.exclude_node_and_restart("ghost", "node1")
