"""The responder and incident post-mortems know the lab through the target file ``lab up``
writes (``<run>/target.yaml``, :func:`stormwatch.platforms.read_lab_target`), never
``lab.json``: both files here come from the lab's own writers."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormwatch.alerts.incident_report.cli import _lab_prometheus
from stormwatch.alerts.incident_report.sources import _lab_rank_nodes
from stormwatch.alerts.responder.service import ResponderSettings
from stormwatch.errors import ConfigError
from stormwatch.lab import Lab
from stormwatch.lab.config import LabConfig
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import LabState, StateStore, plan_state


def _lab(run_dir: Path, *, target: bool = True) -> LabState:
    """lab.json and (with ``target``) target.yaml as ``lab up`` writes them."""
    paths = RunPaths.of(run_dir)
    state = plan_state(paths, LabConfig(nodes=2, nproc_per_node=2, prometheus_port=19999))
    StateStore(paths).save(state)
    if target:
        Lab(run_dir)._write_target_file(state)
    return state


def _settings(tmp_path: Path, run_dir: Path) -> ResponderSettings:
    return ResponderSettings(
        db_path=tmp_path / "r.sqlite", token_file=tmp_path / "t", lab_run_dir=run_dir
    )


def test_the_responder_finds_each_nodes_metrics_dir_in_the_lab_target_file(
    tmp_path: Path,
) -> None:
    state = _lab(tmp_path / "run")
    backend = _settings(tmp_path, tmp_path / "run").lab_backend()
    assert backend is not None
    assert dict(backend.node_metrics_dirs) == {n.name: n.metrics_dir for n in state.nodes}
    assert backend.diagnostics_dir == tmp_path / "run" / "responder" / "diagnostics"
    without = _settings(tmp_path, tmp_path / "empty").lab_backend()  # no lab there
    assert without is not None and dict(without.node_metrics_dirs) == {}


def test_the_responder_does_not_read_lab_json(tmp_path: Path) -> None:
    _lab(tmp_path, target=False)  # lab.json alone: nothing the responder reads
    backend = _settings(tmp_path, tmp_path).lab_backend()
    assert backend is not None and dict(backend.node_metrics_dirs) == {}
    (tmp_path / "lab.json").write_text('{"nodes": [{"name": "node0"}]}')
    Lab(tmp_path)._write_target_file(None)  # a bare lab target (run dir only)
    backend = _settings(tmp_path, tmp_path).lab_backend()
    assert backend is not None and dict(backend.node_metrics_dirs) == {}


def test_a_lab_target_file_that_is_not_valid_is_a_config_error_for_the_responder(
    tmp_path: Path,
) -> None:
    (tmp_path / "target.yaml").write_text("platform: lab\nlab: {nodes: [{name: node0}]}\n")
    with pytest.raises(ConfigError, match=r"lab_run_dir: .*target\.yaml: invalid target file"):
        _settings(tmp_path, tmp_path).lab_backend()


def test_post_mortems_take_ranks_per_node_and_prometheus_from_the_lab_target_file(
    tmp_path: Path,
) -> None:
    _lab(tmp_path)
    assert _lab_rank_nodes(tmp_path) == {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
    assert _lab_prometheus(tmp_path) == "http://127.0.0.1:19999"


def test_post_mortems_without_a_readable_lab_target_file_map_no_ranks_and_query_no_prometheus(
    tmp_path: Path,
) -> None:
    assert _lab_rank_nodes(tmp_path) == {} and _lab_prometheus(tmp_path) is None
    _lab(tmp_path, target=False)  # lab.json is not read
    assert _lab_rank_nodes(tmp_path) == {} and _lab_prometheus(tmp_path) is None
    (tmp_path / "target.yaml").write_text("{torn")
    assert _lab_rank_nodes(tmp_path) == {} and _lab_prometheus(tmp_path) is None
