"""``lab up`` writes the lab's target file; ``lab status`` shows its path; the chaos
commands without ``--target`` use it."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from stormwatch.chaos.errors import LabNotReady
from stormwatch.chaos.platform_target import resolve_target
from stormwatch.lab import Lab
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.status import LabStatus, render_status
from stormwatch.platforms.targets import load_target_file


def test_the_lab_target_file_names_the_lab_and_the_chaos_commands_use_it(
    tmp_path: Path,
) -> None:
    Lab(tmp_path)._write_target_file()
    path = RunPaths.of(tmp_path).target_file
    target = load_target_file(path)
    assert target.platform == "lab"
    assert target.lab is not None and target.lab.run_dir == RunPaths.of(tmp_path).run_dir
    with pytest.raises(LabNotReady, match=r"lab\.json"):  # no lab there: the lab's own answer
        resolve_target(tmp_path, None)


def test_lab_status_shows_the_target_file(tmp_path: Path) -> None:
    status = LabStatus(
        run_dir=tmp_path,
        phase="up",
        healthy=True,
        prometheus_url="http://127.0.0.1:19090",
        alertmanager_url="http://127.0.0.1:19093",
        responder_url="http://127.0.0.1:19095",
        nodes=[],
        services=[],
        jobs=[],
        target_file=tmp_path / "target.yaml",
    )
    console = Console(record=True, width=200)
    render_status(status, console)
    assert f"target file: {tmp_path / 'target.yaml'}" in console.export_text()
