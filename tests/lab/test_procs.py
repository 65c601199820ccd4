"""Detached, supervised processes: exit status recorded, signals forwarded, nothing orphaned."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from stormwatch.lab.errors import LabError
from stormwatch.lab.services import procs
from stormwatch.lab.state import ProcessRecord


def _launch(tmp_path: Path, *cmd: str, name: str = "t") -> ProcessRecord:
    return procs.launch(
        name,
        cmd,
        log_file=tmp_path / f"{name}.log",
        status_file=tmp_path / f"{name}.status.json",
        env={**os.environ, procs.LAB_MARKER_ENV: str(tmp_path)},
    )


def _wait_finished(record: ProcessRecord, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not procs.is_finished(record):
        assert time.monotonic() < deadline, f"{record.name} still running"
        time.sleep(0.05)


def test_exit_code_and_output_are_recorded(tmp_path: Path) -> None:
    go = tmp_path / "go"  # the command is alive until the launch has returned (any load)
    record = _launch(
        tmp_path, "sh", "-c", f"until [ -e {go} ]; do sleep 0.05; done; echo hello; exit 3"
    )
    assert record.pid != os.getpid() and record.create_time > 0
    go.touch()
    _wait_finished(record)
    assert procs.exit_status(record).returncode == 3
    assert "hello" in record.log_file.read_text()


def test_sigterm_to_supervisor_reaches_the_command(tmp_path: Path) -> None:
    record = _launch(tmp_path, "sleep", "60")
    assert procs.is_running(record)
    os.kill(record.supervisor_pid, signal.SIGTERM)
    _wait_finished(record)
    assert procs.exit_status(record).returncode == -signal.SIGTERM


def test_orphans_of_a_killed_command_are_not_left_behind(tmp_path: Path) -> None:
    # The command starts a grandchild in its own session (like torchrun's workers), then dies.
    script = (
        "import subprocess, sys, time;"
        "p = subprocess.Popen(['sleep', '60'], start_new_session=True);"
        "print(p.pid, flush=True); time.sleep(60)"
    )
    record = _launch(tmp_path, sys.executable, "-c", script)
    deadline = time.monotonic() + 20
    while not record.log_file.read_text().strip().splitlines()[1:]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(record.log_file.read_text().strip().splitlines()[-1])
    os.kill(record.pid, signal.SIGKILL)
    _wait_finished(record)
    assert procs.exit_status(record).returncode == -signal.SIGKILL
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == "zombie"


def test_terminate_stops_the_whole_tree(tmp_path: Path) -> None:
    record = _launch(tmp_path, "sh", "-c", "sleep 60 & sleep 60 & wait")
    time.sleep(0.3)
    tree = procs.tree(record)
    assert len(tree) >= 4  # supervisor, sh, two sleeps
    assert procs.terminate(tree, grace=5) == []
    assert procs.tree(record) == []
    assert procs.processes_marked(tmp_path) == []


def test_a_recycled_pid_is_never_treated_as_ours(tmp_path: Path) -> None:
    record = _launch(tmp_path, "sleep", "60")
    impostor = record.model_copy(
        update={
            "create_time": record.create_time - 100,
            "supervisor_create_time": record.supervisor_create_time - 100,
        }
    )
    assert not procs.is_running(impostor)
    assert procs.tree(impostor) == []
    procs.terminate(procs.tree(record))


def test_a_command_that_cannot_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="no-such-program"):
        _launch(tmp_path, "no-such-program-xyz")


def test_marked_processes_are_found_by_run_dir(tmp_path: Path) -> None:
    record = _launch(tmp_path, "sleep", "60")
    found = {p.pid for p in procs.processes_marked(tmp_path)}
    assert {record.pid, record.supervisor_pid} <= found
    assert procs.processes_marked(tmp_path / "other") == []
    procs.terminate(procs.tree(record))
