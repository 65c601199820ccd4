"""The demo's guard rails (fast tier); the demo itself runs in test_e2e_kill_rank.py."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from stormwatch.chaos.gameday.demo import DEMO_MARKER, clean_run_dir
from stormwatch.errors import ConfigError

STORMWATCH = Path(sys.executable).with_name("stormwatch")


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run the demo as an unprivileged user",
)
def test_demo_as_non_root_says_it_needs_root_and_touches_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    tmp_path.chmod(0o777)
    out = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            str(STORMWATCH),
            "demo",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    assert "needs root" in out.stderr and "sudo" in out.stderr
    assert "Traceback" not in out.stderr
    assert not run_dir.exists()


def test_clean_run_dir_refuses_a_folder_that_is_not_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("precious")
    with pytest.raises(ConfigError, match=r"refusing to delete it.*thesis\.tex"):
        clean_run_dir(tmp_path, Console(file=io.StringIO()))
    assert (tmp_path / "thesis.tex").exists()


def test_clean_run_dir_removes_an_old_run_without_a_lab(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    (run_dir / "jobs" / "baseline" / "logs").mkdir(parents=True)
    (run_dir / "experiments").mkdir()
    (run_dir / DEMO_MARKER).touch()
    clean_run_dir(run_dir, Console(file=io.StringIO()))
    assert not run_dir.exists()


def test_clean_run_dir_never_deletes_a_run_directory_the_demo_did_not_make(
    tmp_path: Path,
) -> None:
    """`stormwatch demo --run-dir run` (fresh-user pass): the user's own lab directory,
    with its experiments and fault ledger, would have been brought down and deleted."""
    run_dir = tmp_path / "run"
    (run_dir / "experiments" / "20261205T010203-kill-rank-ab12").mkdir(parents=True)
    (run_dir / "chaos").mkdir()
    (run_dir / "chaos" / "ledger.sqlite").write_text("faults")
    with pytest.raises(ConfigError, match=r"did not make.*another --run-dir"):
        clean_run_dir(run_dir, Console(file=io.StringIO()))
    assert (run_dir / "chaos" / "ledger.sqlite").read_text() == "faults"
    empty = tmp_path / "empty"
    empty.mkdir()
    clean_run_dir(empty, Console(file=io.StringIO()))  # nothing to lose
    assert not empty.exists()


def test_clean_run_dir_takes_every_file_the_lab_writes_for_its_own(tmp_path: Path) -> None:
    # `lab up` began writing target.yaml (and the Slurm folder) after the demo's list of
    # run-dir entries was written: a second `make demo` refused its own run directory.
    run_dir = tmp_path / "demo"
    run_dir.mkdir()
    (run_dir / "target.yaml").write_text("platform: lab\n")
    (run_dir / "slurm" / "etc").mkdir(parents=True)
    (run_dir / "chaos").mkdir()
    (run_dir / DEMO_MARKER).touch()
    clean_run_dir(run_dir, Console(file=io.StringIO()))
    assert not run_dir.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="Lab.down needs root")
def test_clean_run_dir_is_quiet_about_a_lab_that_is_already_down(tmp_path: Path) -> None:
    # `make demo` twice said "bringing down the lab left in run/demo" although it was down.
    import ipaddress

    from stormwatch.lab import LabConfig
    from stormwatch.lab.paths import RunPaths
    from stormwatch.lab.state import StateStore, plan_state

    run_dir = tmp_path / "demo"
    run_dir.mkdir()
    config = LabConfig(prefix="swcln", subnet=ipaddress.IPv4Network("10.217.93.0/24"))
    state = plan_state(RunPaths(run_dir), config)
    state.phase = "down"
    StateStore(RunPaths(run_dir)).save(state)
    (run_dir / DEMO_MARKER).touch()
    output = io.StringIO()

    clean_run_dir(run_dir, Console(file=output))

    assert output.getvalue() == ""
    assert not run_dir.exists()
