"""``lab.json`` has one model, :class:`LabState`: what ``lab up`` writes every reader loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormwatch.lab import LabConfig, LabError
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import StateStore, load_lab_state, plan_state


def test_what_lab_up_writes_every_reader_loads_as_the_same_state(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    state = plan_state(paths, LabConfig(nodes=2, nproc_per_node=2))
    state.phase = "up"
    StateStore(paths).save(state)
    assert load_lab_state(tmp_path) == state
    assert paths.state_file.read_text() == state.model_dump_json(indent=2)


def test_a_run_directory_without_lab_json_has_no_lab_state(tmp_path: Path) -> None:
    assert load_lab_state(tmp_path) is None


@pytest.mark.parametrize("text", ["{not json", '{"nodes": []}', "[]"])
def test_a_file_that_is_not_a_lab_state_is_a_lab_error_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / "lab.json").write_text(text)
    with pytest.raises(LabError, match=r"lab\.json: not a lab state file"):
        load_lab_state(tmp_path)
