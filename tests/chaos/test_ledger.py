"""The fault ledger: durable before the fault is sent, idempotent to revert, orphans found."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stormwatch.chaos import Ledger, LedgerError, revert_open
from stormwatch.chaos.execution.injection.placement import find_rank_process
from stormwatch.chaos.ledger.ledger import ledger_path
from stormwatch.chaos.ledger.revert import OVERDUE_REASON
from stormwatch.contracts.fault_ledger import FaultTarget
from stormwatch.faults import REGISTRY

KillRankFault = REGISTRY["kill_rank"].experiment
FreezeRankFault = REGISTRY["freeze_rank"].experiment


@pytest.fixture
def stormwatch(
    stormwatch: Callable[..., subprocess.CompletedProcess[str]],
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The in-process CLI (tests/conftest.py) on an 80-column terminal unless told. The
    commands also run as real processes below: ``chaos ledger`` after a dead controller,
    ``chaos revert --all``."""

    def run(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
        return stormwatch(*args, columns=columns)

    return run


def _kill_spec() -> Any:
    return KillRankFault(kind="kill_rank", rank=1, signal="SIGKILL", ttl_seconds=60)


def _agent_target() -> FaultTarget:
    return FaultTarget(
        job="j", rank=1, node="node0", agent_url="http://127.0.0.1:9", token_file="/nonexistent"
    )


def test_recorded_fault_survives_a_sigkilled_controller(tmp_path: Path) -> None:
    db = tmp_path / "chaos" / "ledger.sqlite3"
    code = textwrap.dedent(f"""
        import os, signal, time
        from stormwatch.chaos import Ledger
        from stormwatch.contracts.fault_ledger import FaultTarget
        from stormwatch.faults import REGISTRY
        ledger = Ledger({str(db)!r})
        ledger.record(fault_id="exp.kill", experiment_id="exp",
                      spec=REGISTRY["kill_rank"].experiment(kind="kill_rank", rank=1),
                      target=FaultTarget(job="j", rank=1, node="node0",
                                         agent_url="http://10.0.0.1:9400", token_file="/t"),
                      expires_at=time.time() + 60)
        os.kill(os.getpid(), signal.SIGKILL)  # no chance to clean up
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr

    ledger = Ledger(db, create=False)
    [entry] = ledger.entries()
    assert (entry.id, entry.state, entry.kind, entry.target.node) == (
        "exp.kill",
        "pending",
        "kill_rank",
        "node0",
    )
    assert entry.open and entry.expires_at > time.time()
    assert [e.id for e in ledger.orphans()] == ["exp.kill"], "its controller is dead"


def test_faults_of_a_live_controller_are_not_orphans(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    ledger.record(
        fault_id="a",
        experiment_id="e",
        spec=_kill_spec(),
        target=_agent_target(),
        expires_at=time.time() + 60,
    )
    assert ledger.orphans() == []
    assert [e.id for e in ledger.open_faults(experiment_id="e")] == ["a"]
    assert ledger.open_faults(experiment_id="other") == []


def test_state_changes_are_idempotent_and_ordered(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    first = ledger.record(
        fault_id="a", experiment_id="e", spec=_kill_spec(), target=_agent_target(), expires_at=100.0
    )
    again = ledger.record(
        fault_id="a", experiment_id="e", spec=_kill_spec(), target=_agent_target(), expires_at=999.0
    )
    assert again == first, "recording the same id twice changes nothing"
    moved = ledger.retarget("a", _agent_target().model_copy(update={"node": "node1"}))
    assert moved.target.node == "node1"
    injected = ledger.mark_injected("a", injected_at=10.0, expires_at=70.0, target_pid=42)
    assert (injected.state, injected.target_pid, injected.expires_at) == ("injected", 42, 70.0)
    with pytest.raises(LedgerError, match="not pending"):
        ledger.retarget("a", _agent_target())
    assert ledger.mark_reverted("a", reason="test") is True
    assert ledger.mark_reverted("a", reason="again") is False
    closed = ledger.get("a")
    assert closed.state == "reverted" and closed.revert_reason == "test" and not closed.open
    assert ledger.mark_injected("a", injected_at=1, expires_at=2, target_pid=1).state == "reverted"


def test_unknown_fault_and_foreign_file_are_ledger_errors(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    with pytest.raises(LedgerError, match="not in the ledger"):
        ledger.get("nope")
    with pytest.raises(LedgerError, match="no fault ledger"):
        Ledger(tmp_path / "missing.sqlite3", create=False)
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(LedgerError):
        Ledger(garbage)


def test_revert_open_is_idempotent_on_a_real_frozen_process(
    tmp_path: Path, start_workload: Any, unique_job: Any, wait_until: Any
) -> None:
    job = unique_job("ledger")
    workload = start_workload(job)
    process = find_rank_process(job, 0)
    assert process.pid == workload.process.pid
    ledger = Ledger(tmp_path / "l.sqlite3")
    spec = FreezeRankFault(kind="freeze_rank", rank=0, ttl_seconds=3600)
    target = FaultTarget(job=job, rank=0, pid=process.pid, pid_create_time=process.create_time())
    ledger.record(
        fault_id="f", experiment_id="e", spec=spec, target=target, expires_at=time.time() + 3600
    )
    os.kill(process.pid, signal.SIGSTOP)
    wait_until(lambda: workload.stopped, 5, "the process to stop")

    first = asyncio.run(revert_open(ledger, reason="test"))
    second = asyncio.run(revert_open(ledger, reason="test"))

    assert [(o.fault_id, o.ok) for o in first] == [("f", True)]
    assert "SIGCONT" in first[0].detail
    assert second == [], "nothing left open"
    assert not workload.stopped


def test_revert_of_a_gone_process_succeeds_and_never_signals_a_reused_pid(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    ledger = Ledger(tmp_path / "l.sqlite3")
    # The pid may be reused by now; the start time cannot match.
    target = FaultTarget(job="j", rank=0, pid=proc.pid, pid_create_time=1.0)
    ledger.record(
        fault_id="f",
        experiment_id="e",
        spec=FreezeRankFault(kind="freeze_rank", rank=0),
        target=target,
        expires_at=time.time(),
    )
    [outcome] = asyncio.run(revert_open(ledger, reason="test"))
    assert outcome.ok and "gone" in outcome.detail


def test_unreachable_agent_keeps_an_unexpired_fault_open(tmp_path: Path) -> None:
    token = tmp_path / "agent.token"
    token.write_text("secret\n")
    ledger = Ledger(tmp_path / "l.sqlite3")
    target = FaultTarget(
        job="j", rank=1, node="node0", agent_url="http://127.0.0.1:1", token_file=str(token)
    )
    ledger.record(
        fault_id="live",
        experiment_id="e",
        spec=_kill_spec(),
        target=target,
        expires_at=time.time() + 600,
    )
    ledger.record(
        fault_id="expired",
        experiment_id="e",
        spec=_kill_spec(),
        target=target,
        expires_at=time.time() - 1,
    )

    outcomes = {o.fault_id: o for o in asyncio.run(revert_open(ledger, reason="test"))}

    assert not outcomes["live"].ok and "cannot reach the agent" in outcomes["live"].detail
    assert ledger.get("live").open and ledger.get("live").last_error
    assert outcomes["expired"].ok and "expired" in outcomes["expired"].detail
    assert not ledger.get("expired").open


@pytest.mark.parametrize("command", [("chaos", "ledger"), ("lab", "status")])
def test_overdue_frozen_rank_is_thawed_by_the_next_command(
    tmp_path: Path,
    start_workload: Any,
    unique_job: Any,
    wait_until: Any,
    command: tuple[str, str],
    stormwatch: Any,
) -> None:
    """Controller and reaper both dead: the next lab command reverts the fault (``chaos
    ledger`` as a real process, ``lab status`` in-process)."""
    job = unique_job("overdue")
    workload = start_workload(job)
    process = find_rank_process(job, 0)
    run_dir = tmp_path / "run"
    ledger = Ledger(ledger_path(run_dir))
    target = FaultTarget(job=job, rank=0, pid=process.pid, pid_create_time=process.create_time())
    ledger.record(
        fault_id="frozen",
        experiment_id="e",
        spec=FreezeRankFault(kind="freeze_rank", rank=0, ttl_seconds=1),
        target=target,
        expires_at=time.time() - 5,  # past its TTL; no reaper runs
    )
    ledger.mark_injected(
        "frozen", injected_at=time.time() - 6, expires_at=time.time() - 5, target_pid=process.pid
    )
    os.kill(process.pid, signal.SIGSTOP)
    wait_until(lambda: workload.stopped, 5, "the process to stop")
    # A fault whose revert fails stays open and is shown OVERDUE.
    ledger.record(
        fault_id="stuck",
        experiment_id="e",
        spec=_kill_spec(),
        target=_agent_target(),
        expires_at=time.time() - 5,
    )

    if command == ("chaos", "ledger"):
        out = subprocess.run(
            [
                str(Path(sys.executable).with_name("stormwatch")),
                *command,
                "--run-dir",
                str(run_dir),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "250"},
        )
    else:
        out = stormwatch(*command, "--run-dir", str(run_dir), columns=250)

    assert "reverted overdue fault frozen" in out.stderr, out.stderr
    assert "overdue fault stuck could not be reverted" in out.stderr
    assert "Traceback" not in out.stderr
    wait_until(lambda: not workload.stopped, 5, "the process to continue")
    entry = ledger.get("frozen")
    assert entry.state == "reverted" and entry.revert_reason == OVERDUE_REASON
    assert ledger.get("stuck").open
    if command == ("chaos", "ledger"):
        assert "OVERDUE" in out.stdout and "stuck" in out.stdout


def _ledger_rows(out: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in out.splitlines()
        if line.startswith("│")
    ]


def test_ledger_table_keeps_one_line_per_fault_at_80_columns(tmp_path: Path, stormwatch) -> None:
    run_dir = tmp_path / "run"
    ledger = Ledger(ledger_path(run_dir))
    now = time.time()
    long_id = "20261130T180000-kill-one-rank-during-a-long-pretraining-run-1a2b.kill"
    ledger.record(
        fault_id=long_id,
        experiment_id="e",
        spec=_kill_spec(),
        target=_agent_target(),
        expires_at=now + 600,
    )
    ledger.mark_injected(long_id, injected_at=now - 125, expires_at=now + 600, target_pid=42)
    ledger.record(
        fault_id="e.freeze",
        experiment_id="e",
        spec=FreezeRankFault(kind="freeze_rank", rank=3, ttl_seconds=30),
        target=_agent_target(),
        expires_at=now + 30,
    )
    ledger.mark_reverted("e.freeze", reason="experiment finished and the steady state held")

    def ledger_at(columns: int) -> str:
        out = stormwatch("chaos", "ledger", "--run-dir", str(run_dir), columns=columns)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        return out.stdout

    narrow = ledger_at(80)
    assert all(len(line) <= 80 for line in narrow.splitlines()), narrow
    killed, frozen = _ledger_rows(narrow)  # one line each
    assert killed[0].startswith("20261130T180000-kill-one-rank") and killed[0].endswith("…")
    assert killed[1:] == ["kill_rank", "1", "injected", "2m"]  # kind, rank, state, age
    assert frozen[:4] == ["e.freeze", "freeze_rank", "3", "reverted"]
    wide = ledger_at(200)
    killed, frozen = _ledger_rows(wide)
    assert killed[0] == long_id and killed[3] == "node0"  # where
    assert frozen[-1].endswith("by experiment finished and the steady state held")
    assert ", reverted " in frozen[-1]  # fresh user: "injected 08:01:14 08:01:34 by ..."
    assert "…" not in wide


def test_an_unreadable_row_is_named_and_the_other_faults_are_still_reverted(
    tmp_path: Path, stormwatch: Any
) -> None:
    """One corrupt row must not keep ``chaos revert --all`` from reverting the rest."""
    run_dir = tmp_path / "run"
    ledger = Ledger(ledger_path(run_dir))
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    for fault_id in ("exp.gone", "exp.broken"):
        ledger.record(
            fault_id=fault_id,
            experiment_id="exp",
            spec=FreezeRankFault(kind="freeze_rank", rank=0),
            target=FaultTarget(job="j", rank=0, pid=proc.pid, pid_create_time=1.0),
            expires_at=time.time() + 3600,
        )
    with sqlite3.connect(ledger.path) as conn:
        conn.execute("UPDATE faults SET spec='{not json' WHERE id='exp.broken'")

    done = subprocess.run(
        [str(Path(sys.executable).with_name("stormwatch")), "chaos", "revert", "--all",
         "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    out = " ".join(done.stdout.split())
    assert "reverted exp.gone" in out
    assert "UNREADABLE exp.broken: " in out and "not reverted" in out
    assert "DELETE FROM faults WHERE id='exp.broken'" in out
    assert not Ledger(ledger.path, create=False).get("exp.gone").open
    listing = stormwatch("chaos", "ledger", "--run-dir", str(run_dir))
    assert listing.returncode == 1 and "Traceback" not in listing.stderr
    assert "UNREADABLE exp.broken" in " ".join(listing.stdout.split())


def test_an_unreadable_row_says_why_and_naming_it_does_not_call_it_unknown(
    tmp_path: Path, stormwatch: Any
) -> None:
    """The reason names the column and the problem, not pydantic's union title; reverting
    the row by id says it is unreadable (exit 1), not that it is missing from the ledger."""
    run_dir = tmp_path / "run"
    ledger = Ledger(ledger_path(run_dir))
    ledger.record(
        fault_id="exp.broken",
        experiment_id="exp",
        spec=FreezeRankFault(kind="freeze_rank", rank=0),
        target=FaultTarget(job="j", rank=0, pid=1, pid_create_time=1.0),
        expires_at=time.time() + 3600,
    )
    with sqlite3.connect(ledger.path) as conn:
        conn.execute("""UPDATE faults SET spec='{"kind": "melt_gpu"}' WHERE id='exp.broken'""")
    listed = stormwatch("chaos", "ledger", "--run-dir", str(run_dir))
    reverted = stormwatch("chaos", "revert", "exp.broken", "--run-dir", str(run_dir))

    assert listed.returncode == 1, listed.stdout + listed.stderr
    out = " ".join(listed.stdout.split())
    assert "UNREADABLE exp.broken: spec:" in out and "melt_gpu" in out
    assert "tagged-union" not in listed.stdout + listed.stderr
    assert reverted.returncode == 1, reverted.stdout + reverted.stderr
    assert "Traceback" not in reverted.stderr
    assert "not in the ledger" not in reverted.stderr
    assert "unreadable in the ledger" in reverted.stderr
