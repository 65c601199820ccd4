"""FC-13: an aborted or crashed controller never leaves a fault in place.

The fault is ``freeze_rank`` (SIGSTOP, reverted by SIGCONT) on a real process
(``workload.py``, a stand-in rank) so "left in place" is observable: the
process stays stopped. The controller is a real process running the library's
runner (``controller.py``).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from stormwatch.chaos import Ledger, ledger_path
from stormwatch.contracts.journal import load_journal

STORMWATCH = Path(sys.executable).with_name("stormwatch")
CONTROLLER = Path(__file__).resolve().parent / "controller.py"


def _experiment(path: Path, job: str, ttl: float) -> Path:
    path.write_text(f"""
version: 1
title: freeze a rank, then wait forever
job: {{name: {job}, steps: 1000000, checkpoint_every: 10, startup_timeout_seconds: 60}}
steady_state_hypothesis:
  title: the rank steps
  probes:
    - name: rank-progressing
      provider: {{type: job, expect: progressing, window_seconds: 5}}
      timeout_seconds: 10
method:
  - type: action
    name: freeze-rank-0
    fault: {{kind: freeze_rank, rank: 0, ttl_seconds: {ttl}}}
  - type: probe
    name: wait-for-progress
    provider: {{type: job, expect: progressing, window_seconds: 5}}
    timeout_seconds: 600
rollbacks:
  - {{type: revert, name: revert-faults, scope: experiment}}
""")
    return path


def _start_controller(
    tmp_path: Path, job: str, ttl: float, procs: list[subprocess.Popen[str]], wait_until: Any
) -> tuple[subprocess.Popen[str], Ledger]:
    exp = _experiment(tmp_path / f"{job}.yaml", job, ttl)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(CONTROLLER), str(exp), str(run_dir), job, "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    procs.append(proc)
    path = ledger_path(run_dir)
    wait_until(path.exists, 60, "the ledger to be created")
    ledger = Ledger(path, create=False)
    wait_until(
        lambda: any(e.state == "injected" for e in ledger.entries()), 60, "the fault to be injected"
    )
    return proc, ledger


def test_fc13_sigint_during_method_reverts_fault_and_writes_journal(
    tmp_path: Path,
    start_workload: Any,
    controllers: Any,
    unique_job: Any,
    wait_until: Any,
    find_reapers: Any,
) -> None:
    job = unique_job("fc13-int")
    workload = start_workload(job)
    proc, ledger = _start_controller(
        tmp_path, job, ttl=3600, procs=controllers, wait_until=wait_until
    )
    wait_until(lambda: workload.stopped, 10, "the rank to be frozen")

    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)

    assert proc.returncode == 130, out
    [entry] = ledger.entries()
    assert entry.state == "reverted", entry
    assert entry.revert_reason == "rollback revert-faults"
    assert not workload.stopped
    steps = workload.steps()
    wait_until(lambda: workload.steps() > steps, 10, "the rank to step again")
    experiment_dir = Path(out.split("experiment-dir ", 1)[1].split()[0])
    journal = load_journal(experiment_dir / "journal.json")
    assert journal.status == "aborted"
    assert [(r.name, r.status) for r in journal.method] == [
        ("freeze-rank-0", "succeeded"),
        ("wait-for-progress", "aborted"),
    ]
    assert [(r.name, r.status) for r in journal.rollbacks] == [("revert-faults", "succeeded")]
    assert journal.rollbacks_ok is True
    assert journal.faults[0].state == "reverted"
    for record in journal.method + journal.rollbacks:
        assert record.start and record.end and record.end >= record.start
    wait_until(lambda: not find_reapers(ledger.path), 10, "the reaper to exit")


def test_fc13_killed_controller_fault_reverted_at_ttl_by_reaper(
    tmp_path: Path,
    start_workload: Any,
    controllers: Any,
    unique_job: Any,
    wait_until: Any,
    find_reapers: Any,
) -> None:
    job = unique_job("fc13-ttl")
    workload = start_workload(job)
    proc, ledger = _start_controller(tmp_path, job, ttl=4, procs=controllers, wait_until=wait_until)
    proc.kill()
    proc.communicate(timeout=10)
    assert workload.stopped
    [entry] = ledger.entries()
    assert entry.open

    wait_until(lambda: not ledger.get(entry.id).open, 30, "the reaper to revert at the TTL")

    reverted = ledger.get(entry.id)
    assert reverted.revert_reason == "ttl"
    assert reverted.reverted_at is not None and reverted.reverted_at >= entry.expires_at
    wait_until(lambda: not workload.stopped, 5, "the rank to continue")


def test_fc13_killed_controller_fault_reverted_by_revert_all_idempotently(
    tmp_path: Path,
    start_workload: Any,
    controllers: Any,
    unique_job: Any,
    wait_until: Any,
    find_reapers: Any,
) -> None:
    job = unique_job("fc13-cli")
    workload = start_workload(job)
    proc, ledger = _start_controller(
        tmp_path, job, ttl=3600, procs=controllers, wait_until=wait_until
    )
    proc.kill()
    proc.communicate(timeout=10)
    assert workload.stopped

    run_dir = str(tmp_path / "run")
    first = subprocess.run(
        [str(STORMWATCH), "chaos", "revert", "--all", "--run-dir", run_dir],
        capture_output=True,
        text=True,
        timeout=60,
    )
    second = subprocess.run(
        [str(STORMWATCH), "chaos", "revert", "--all", "--run-dir", run_dir],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert first.returncode == 0, first.stdout + first.stderr
    assert "reverted" in first.stdout and "SIGCONT" in first.stdout
    assert second.returncode == 0 and "nothing to revert" in second.stdout
    [entry] = ledger.entries()
    assert entry.state == "reverted" and entry.revert_reason == "chaos revert"
    assert not workload.stopped
    wait_until(lambda: not find_reapers(ledger.path), 10, "the reaper to exit")


def test_fc13_next_controller_start_reverts_what_a_dead_one_left(
    tmp_path: Path,
    start_workload: Any,
    controllers: Any,
    unique_job: Any,
    wait_until: Any,
    find_reapers: Any,
) -> None:
    job = unique_job("fc13-next")
    workload = start_workload(job)
    proc, ledger = _start_controller(
        tmp_path, job, ttl=3600, procs=controllers, wait_until=wait_until
    )
    proc.kill()
    proc.communicate(timeout=10)
    assert workload.stopped
    quick = tmp_path / "quick.yaml"
    quick.write_text(f"""
version: 1
title: just check
job: {{name: {job}, steps: 1000000, checkpoint_every: 10}}
steady_state_hypothesis:
  title: the rank steps
  probes:
    - name: rank-progressing
      provider: {{type: job, expect: progressing, window_seconds: 5}}
      timeout_seconds: 10
method:
  - {{type: pause, name: breathe, seconds: 0.1}}
""")

    second = subprocess.run(
        [sys.executable, str(CONTROLLER), str(quick), str(tmp_path / "run"), job, "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert second.returncode == 0, second.stdout + second.stderr
    [entry] = ledger.entries()
    assert entry.state == "reverted" and entry.revert_reason == "controller start"
    assert not workload.stopped
    experiment_dir = Path(second.stdout.split("experiment-dir ", 1)[1].split()[0])
    journal = load_journal(experiment_dir / "journal.json")
    assert journal.recovery[0].status == "succeeded"
    output = journal.recovery[0].output
    assert isinstance(output, list) and isinstance(output[0], dict)
    assert output[0]["fault_id"] == entry.id


@pytest.fixture(autouse=True)
def _no_leftover_reapers(tmp_path: Path, find_reapers: Any) -> Iterator[None]:
    yield
    for proc in find_reapers(ledger_path(tmp_path / "run")):
        with contextlib.suppress(psutil.Error):
            proc.kill()
