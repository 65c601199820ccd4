"""What ``lab down`` says: while it stops the lab's Slurm cluster (without a real cluster: its
processes and runtime files are stood in for, nothing is stopped), and what it removed."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from stormwatch.lab import LabConfig, ProgressEvent, teardown
from stormwatch.lab.slurm import daemons
from stormwatch.lab.slurm.cluster import SlurmCluster


def test_stopping_the_slurm_cluster_says_how_many_processes_and_files_are_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = [tmp_path / "slurmctld.pid", tmp_path / "spool", tmp_path / "munge.key"]
    files[0].touch()
    files[1].mkdir()
    me = psutil.Process()
    monkeypatch.setattr(daemons, "cluster_processes", lambda config: [me, me, me])
    monkeypatch.setattr(daemons, "runtime_files", lambda config: iter(files))
    stopped: list[SlurmCluster] = []
    monkeypatch.setattr(SlurmCluster, "stop", lambda cluster: stopped.append(cluster))
    events: list[ProgressEvent] = []

    removed, problems = teardown.stop_slurm(tmp_path / "run", LabConfig(), events.append)

    assert [e.message for e in events] == [
        "stopping the Slurm cluster (3 processes; 2 runtime files to delete)"
    ]
    assert (removed, problems, len(stopped)) == (["the Slurm cluster"], [], 1)


def test_a_slurm_cluster_with_nothing_left_is_not_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemons, "cluster_processes", lambda config: [])
    monkeypatch.setattr(daemons, "runtime_files", lambda config: iter([tmp_path / "gone"]))
    monkeypatch.setattr(SlurmCluster, "stop", lambda cluster: pytest.fail("stopped"))
    events: list[ProgressEvent] = []

    assert teardown.stop_slurm(tmp_path / "run", LabConfig(), events.append) == ([], [])
    assert events == []


@pytest.mark.parametrize(
    ("removed", "summary"),
    [
        ([], "nothing was left to remove"),
        (["netns a"], "removed 1 network namespace"),
        (
            [
                "the Slurm cluster",
                "process agent-node0",
                "process agent-node1",
                "process prometheus",
                "2 unrecorded processes",
                "netns sw-node0",
                "netns sw-node1",
                "veth sw-v0",
                "bridge sw-br0",
            ],
            "removed the Slurm cluster, 3 processes, 2 unrecorded processes, "
            "2 network namespaces, 1 veth and 1 bridge",
        ),
    ],
)
def test_what_lab_down_removed_is_one_line_counted_by_kind(
    removed: list[str], summary: str
) -> None:
    assert teardown.removed_summary(removed) == summary
