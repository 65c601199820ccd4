"""Fixtures for the chaos tests: real stand-in rank processes and experiment files."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "workload.py"
CONTROLLER = HERE / "controller.py"
_names = itertools.count()


@dataclass
class Workload:
    """A running stand-in rank: its process, job name and log file."""

    process: subprocess.Popen[bytes]
    job: str
    rank: int
    log: Path

    @property
    def stopped(self) -> bool:
        return psutil.Process(self.process.pid).status() == psutil.STATUS_STOPPED

    def steps(self) -> int:
        try:
            return sum('"step"' in line for line in self.log.read_text().splitlines())
        except FileNotFoundError:
            return 0


def _unique_job(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture
def unique_job() -> Callable[[str], str]:
    """Job names no other test (or test run) uses: stand-in ranks are found by them."""
    return _unique_job


@pytest.fixture
def start_workload(
    tmp_path: Path, wait_for: Callable[..., object]
) -> Iterator[Callable[..., Workload]]:
    """Start stand-in ranks under ``<tmp>/run/jobs/<job>/logs``; all are killed at teardown."""
    started: list[Workload] = []

    def start(job: str, rank: int = 0, step_seconds: float = 0.05) -> Workload:
        log_dir = tmp_path / "run" / "jobs" / job / "logs"
        env = {**os.environ, "STORMWATCH_JOB": job, "RANK": str(rank)}
        process = subprocess.Popen(
            [sys.executable, str(WORKLOAD), str(log_dir), str(step_seconds)], env=env
        )
        workload = Workload(process, job, rank, log_dir / f"rank{rank}.jsonl")
        started.append(workload)
        wait_for(lambda: workload.steps() >= 1, 30, "the workload's first step")
        return workload

    yield start
    for workload in started:
        if workload.process.poll() is None:
            workload.process.kill()
        workload.process.wait(timeout=10)


@pytest.fixture
def controllers() -> Iterator[list[subprocess.Popen[str]]]:
    """Controller processes a test starts; killed at teardown if still running."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.fixture
def wait_until(wait_for: Callable[..., object]) -> Callable[..., object]:
    """``wait_until(condition, timeout, what)``: poll until true, fail naming ``what``."""
    return wait_for


def reapers(ledger: Path) -> list[psutil.Process]:
    """Reaper processes started for faults in ``ledger``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "stormwatch.chaos.ledger.reaper" in cmd and str(ledger) in cmd:
            found.append(proc)
    return found


@pytest.fixture
def find_reapers() -> Callable[[Path], list[psutil.Process]]:
    """``find_reapers(ledger)``: reaper processes of that ledger."""
    return reapers
