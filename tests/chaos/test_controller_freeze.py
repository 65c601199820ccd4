"""The controller-side freeze (``freeze_rank``) answers once the rank is seen stopped, and its
revert once the rank runs again. Signals are asynchronous: the state changes when the target
is next scheduled, so a check right after ``kill()`` often still reads it running (cc26's
flake in the catalogue's e2e test). The agent-side ``freeze_ranks`` already waited."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, cast

import psutil
import pytest

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.execution.injection.placement import apply_fault, find_rank_process
from stormwatch.chaos.ledger.undo import undo_fault
from stormwatch.contracts.fault_ledger import FaultTarget
from stormwatch.faults import REGISTRY
from stormwatch.faults.system import wait_continued, wait_stopped

FreezeRankFault = REGISTRY["freeze_rank"].experiment
NO_AGENTS = cast(AgentClient, None)  # a controller-side kind talks to no agent


@pytest.fixture
def busy_cpu() -> Iterator[int]:
    """A CPU kept busy by a spinning process: a rank made to share it with ``SCHED_IDLE``
    waits to be scheduled, as a rank on a loaded node does, so a signal takes effect late."""
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(hog.pid, {cpu})
    yield cpu
    hog.kill()
    hog.wait(timeout=30)


def test_freeze_rank_answers_once_the_rank_is_stopped_and_its_revert_once_it_runs(
    start_workload: Any, unique_job: Any, busy_cpu: int
) -> None:
    job = unique_job("freeze")
    start_workload(job, step_seconds=0.005)
    process = find_rank_process(job, 0)
    os.sched_setaffinity(process.pid, {busy_cpu})
    os.sched_setscheduler(process.pid, os.SCHED_IDLE, os.sched_param(0))
    spec = FreezeRankFault(kind="freeze_rank", rank=0, ttl_seconds=60)
    target = FaultTarget(job=job, rank=0, pid=process.pid, pid_create_time=process.create_time())

    async def rounds() -> list[tuple[str, str]]:
        seen = []
        for n in range(20):  # before the fix, about half of the reads right after missed
            await apply_fault(fault_id=f"f{n}", spec=spec, target=target, agents=NO_AGENTS)
            frozen = process.status()
            await undo_fault(fault_id=f"f{n}", spec=spec, target=target, agents=NO_AGENTS)
            seen.append((frozen, process.status()))
        return seen

    seen = asyncio.run(rounds())
    assert [frozen for frozen, _ in seen] == [psutil.STATUS_STOPPED] * 20
    assert psutil.STATUS_STOPPED not in [thawed for _, thawed in seen]


def test_waiting_for_a_signal_counts_a_process_that_is_gone_as_done() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    process = psutil.Process(proc.pid)
    proc.wait(timeout=30)
    assert wait_stopped([process], timeout=0) == []
    assert wait_continued([process], timeout=0) == []


def test_waiting_for_a_signal_counts_a_zombie_as_done() -> None:
    """An exited child not yet reaped: nothing left to stop (breaker's finding: it waited the
    whole 2 s and named it)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        process = psutil.Process(proc.pid)
        wait_until_zombie = 0
        while process.status() != psutil.STATUS_ZOMBIE and wait_until_zombie < 500:
            time.sleep(0.02)
            wait_until_zombie += 1
        assert process.status() == psutil.STATUS_ZOMBIE
        assert wait_stopped([process], timeout=0) == []
        assert wait_continued([process], timeout=0) == []
    finally:
        proc.wait(timeout=30)


def test_waiting_for_a_signal_names_the_processes_it_did_not_see_change() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        process = psutil.Process(proc.pid)
        assert wait_stopped([process], timeout=0.1) == [proc.pid], "never sent SIGSTOP"
        process.suspend()
        assert wait_stopped([process]) == []
        assert wait_continued([process], timeout=0.1) == [proc.pid], "never sent SIGCONT"
        process.resume()
        assert wait_continued([process]) == []
    finally:
        proc.kill()
        proc.wait(timeout=30)
