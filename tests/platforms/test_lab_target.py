"""The lab as the platform layer sees it: the target file ``lab up`` writes (its
Prometheus, nodes with their metrics directories, ranks per node), read back by
:func:`read_lab_target` into a :class:`LabBackend` and the rank placement; the files
here come from the lab's own writers (lab.json and target.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stormwatch.lab import Lab
from stormwatch.lab.config import LabConfig
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import LabState, StateStore, plan_state
from stormwatch.platforms import (
    InvalidTargetFile,
    LabBackend,
    lab_placement,
    lab_target_path,
    read_lab_target,
)
from stormwatch.platforms.targets import LabSection, lab_target_file, parse_target_file


def _lab_up(run_dir: Path, **config: Any) -> LabState:
    """What ``lab up`` leaves for readers: lab.json, then the lab's target file from it."""
    paths = RunPaths.of(run_dir)
    state = plan_state(paths, LabConfig(**config))
    StateStore(paths).save(state)
    Lab(run_dir)._write_target_file(state)
    return state


def test_the_lab_target_file_is_where_the_lab_writes_it(tmp_path: Path) -> None:
    assert lab_target_path(tmp_path) == RunPaths.of(tmp_path).target_file
    assert read_lab_target(tmp_path) is None  # no lab: no file, no error


@pytest.mark.parametrize(("scheduler", "platform"), [("direct", "lab"), ("slurm", "slurm")])
def test_the_lab_target_file_carries_prometheus_nodes_and_ranks_per_node(
    tmp_path: Path, scheduler: str, platform: str
) -> None:
    state = _lab_up(tmp_path, nodes=3, nproc_per_node=2, prometheus_port=19998, scheduler=scheduler)
    target = read_lab_target(tmp_path)
    assert target is not None and target.platform == platform and target.lab is not None
    assert target.prometheus is not None and target.prometheus.url == state.prometheus_url
    assert target.prometheus.url == "http://127.0.0.1:19998"
    assert target.lab.run_dir == state.run_dir
    assert [(n.name, n.metrics_dir) for n in target.lab.nodes] == [
        (n.name, n.metrics_dir) for n in state.nodes
    ]
    assert target.lab.nproc_per_node == 2


def test_the_placement_of_a_lab_job_is_node_by_node(tmp_path: Path) -> None:
    _lab_up(tmp_path, nodes=3, nproc_per_node=2)
    target = read_lab_target(tmp_path)
    assert target is not None and target.lab is not None
    assert lab_placement(target.lab) == {0: "node0", 1: "node0", 2: "node1", 3: "node1"} | {
        4: "node2",
        5: "node2",
    }
    assert lab_placement(LabSection(run_dir=tmp_path)) == {}  # a hand-written lab target


def test_the_lab_backend_for_a_run_dir_maps_nodes_to_metrics_dirs(tmp_path: Path) -> None:
    state = _lab_up(tmp_path / "run", nodes=2)
    backend = LabBackend.for_lab(tmp_path / "run", diagnostics_dir=tmp_path / "diag")
    assert dict(backend.node_metrics_dirs) == {n.name: n.metrics_dir for n in state.nodes}
    assert backend.diagnostics_dir == tmp_path / "diag"
    empty = LabBackend.for_lab(tmp_path / "none", diagnostics_dir=tmp_path / "diag")
    assert dict(empty.node_metrics_dirs) == {}


def test_an_unreadable_lab_target_file_is_an_invalid_target_file(tmp_path: Path) -> None:
    lab_target_path(tmp_path).write_text("platform: lab\nlab: {run_dir: [1]}\n")
    with pytest.raises(InvalidTargetFile, match=r"lab\.run_dir"):
        read_lab_target(tmp_path)
    lab_target_path(tmp_path).unlink()
    lab_target_path(tmp_path).mkdir()  # a folder in its place
    with pytest.raises(InvalidTargetFile, match="cannot read the file"):
        LabBackend.for_lab(tmp_path, diagnostics_dir=tmp_path)


def test_a_hand_written_lab_target_may_name_prometheus_and_relative_metrics_dirs(
    tmp_path: Path,
) -> None:
    text = (
        "platform: lab\nprometheus: {url: 'http://127.0.0.1:19090'}\n"
        "lab:\n  run_dir: run\n  nproc_per_node: 4\n"
        "  nodes: [{name: a, metrics_dir: run/nodes/a/metrics}]\n"
    )
    target = parse_target_file(text, tmp_path / "target.yaml")
    assert target.prometheus is not None and target.prometheus.url == "http://127.0.0.1:19090"
    assert target.lab is not None and target.lab.run_dir == tmp_path / "run"
    assert target.lab.nodes[0].metrics_dir == tmp_path / "run" / "nodes" / "a" / "metrics"
    assert lab_placement(target.lab) == {0: "a", 1: "a", 2: "a", 3: "a"}


def test_a_lab_without_prometheus_writes_no_prometheus_section(tmp_path: Path) -> None:
    target = lab_target_file(tmp_path, prometheus_url="", nodes={"node0": tmp_path / "m"})
    assert target.prometheus is None and target.lab is not None
    assert [n.name for n in target.lab.nodes] == ["node0"]
