"""Stopping always stops: SIGTERM, a bounded grace period, SIGKILL, then confirmed gone.

Every stop or restart of training processes (the responder's actions on every platform,
the lab's own jobs and services, a chaos run stopping its job) follows one sequence:

1. SIGTERM (torchrun forwards it to its workers; the trainer turns it into a clean exit
   with a post-mortem dump);
2. wait at most the **grace period** for them to exit;
3. SIGKILL whatever is left: a rank blocked inside a gloo or NCCL collective runs no
   Python signal handler until the collective returns, which with a frozen peer is the
   collective timeout (minutes), so it never exits on SIGTERM alone (seen: alive 15 s
   after SIGTERM, issue 17);
4. confirm every process is gone before anything is started again in its place (its
   ports, GPUs and checkpoint files are free; a new rank never races an old one).

Where the processes are visible (the lab shares one PID namespace with the responder and
the chaos controller) :func:`stop_processes` does all four steps. Where a scheduler owns
them, the scheduler does steps 1-3 and the backend confirms step 4: Slurm sends SIGTERM,
then SIGKILL after ``KillWait`` (slurm.conf(5); the lab renders ``KillWait`` from its grace
period), and the job leaves COMPLETING (and its steps ``squeue --steps``) only once slurmd
saw the processes gone (:func:`stormwatch.platforms.slurm_readback.requeue_and_start`);
Kubernetes deletes and evicts with ``gracePeriodSeconds`` (the kubelet's SIGTERM -> SIGKILL)
and the backend waits for the old pods to disappear from the API, not only to be marked
terminating (:mod:`stormwatch.platforms.kubernetes.backend`).

The grace period is one setting, ``grace_period_s`` (:data:`GracePeriod`): top level of a
target file and of ``--platform-config`` (:class:`~.targets.PlatformSettings`, default
:data:`DEFAULT_GRACE_PERIOD_S`), and :attr:`stormwatch.lab.LabConfig.grace_period_s` for
the lab (default 5 s), which ``lab up`` writes into the lab's target file and its
``slurm.conf`` (``KillWait``).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

import psutil
from pydantic import Field

from stormwatch.platforms.errors import NotStopped

log = logging.getLogger(__name__)

#: Default grace period, seconds: Kubernetes' ``terminationGracePeriodSeconds`` default and
#: Slurm's ``KillWait`` default (slurm.conf(5)) are both 30 s.
DEFAULT_GRACE_PERIOD_S = 30
#: Largest grace period accepted, seconds (an hour: a stop that may take longer is no stop).
MAX_GRACE_PERIOD_S = 3600
#: Seconds after SIGKILL within which the processes must be seen gone. The kernel frees a
#: killed process in milliseconds; a process in uninterruptible sleep (D state: a hung NFS
#: or GPU driver call) dies only when that call returns, and is then reported as left.
CONFIRM_TIMEOUT_S = 5.0
#: Seconds between two looks at the processes while waiting.
POLL_S = 0.05

#: The grace period setting: whole seconds from SIGTERM to SIGKILL (0: SIGKILL at once),
#: at most :data:`MAX_GRACE_PERIOD_S`. Whole seconds because Kubernetes
#: (``gracePeriodSeconds``) and Slurm (``KillWait``) take whole seconds.
GracePeriod = Annotated[int, Field(ge=0, le=MAX_GRACE_PERIOD_S)]


@dataclass(frozen=True)
class Stopped:
    """What one :func:`stop_processes` did.

    Attributes:
        terminated: pids sent SIGTERM.
        killed: pids still running after the grace period, sent SIGKILL.
        left: pids still running :data:`CONFIRM_TIMEOUT_S` after SIGKILL (should be empty).
        grace_s: the grace period used, seconds.
        seconds: how long the whole stop took, seconds.
    """

    terminated: tuple[int, ...]
    killed: tuple[int, ...]
    left: tuple[int, ...]
    grace_s: float
    seconds: float

    @property
    def gone(self) -> bool:
        """Whether every process was confirmed gone."""
        return not self.left

    def describe(self) -> str:
        """One line: ``SIGKILL to 1 (pid 42) still running 5 s after SIGTERM; all gone
        after 5.1 s`` (or what is left)."""
        parts = []
        if self.killed:
            parts.append(
                f"SIGKILL to {len(self.killed)} still running {self.grace_s:g} s after SIGTERM "
                f"(pids {list(self.killed)})"
            )
        if self.left:
            parts.append(f"still running after SIGKILL: pids {list(self.left)}")
        else:
            parts.append(f"all gone after {self.seconds:.1f} s")
        return "; ".join(parts)


def stop_processes(
    procs: Iterable[psutil.Process],
    *,
    grace_s: float,
    term: Iterable[psutil.Process] | None = None,
    confirm_s: float = CONFIRM_TIMEOUT_S,
) -> Stopped:
    """SIGTERM, wait up to ``grace_s``, SIGKILL what is left of ``procs``, wait until gone.

    Args:
        procs: every process that must be gone at the end, collected *before* this call
            (a torchrun and its workers: once torchrun is killed its workers are orphans
            that no later tree walk finds). A process is its pid and start time (a
            ``psutil.Process``), so a recycled pid is never signalled. This process and
            pid 1 are never signalled.
        grace_s: seconds between SIGTERM and SIGKILL (0: SIGKILL right after SIGTERM).
        term: the processes that get SIGTERM (default: all of ``procs``); e.g. only the
            torchrun agents, which forward it to their workers and must not be
            restarted by a second signal. Every process of ``procs`` still running after
            the grace period gets SIGKILL.
        confirm_s: seconds after SIGKILL to see them gone.

    Returns:
        What was done (:class:`Stopped`); ``left`` lists those still running (a zombie
        counts as gone: it holds no memory, port or file).

    Raises:
        NotStopped: not allowed to signal a process (another user's).
    """
    started = time.monotonic()
    own = os.getpid()
    every = {p.pid: p for p in procs if p.pid > 1 and p.pid != own}
    first = list(every.values()) if term is None else [p for p in term if p.pid in every]
    for proc in first:
        _signal(proc, signal.SIGTERM)
    alive = wait_gone(list(every.values()), grace_s)
    for proc in alive:
        if grace_s > 0:  # grace 0: the caller asked for SIGKILL, nothing to warn about
            log.warning(
                "pid %d did not exit %g s after SIGTERM; sending SIGKILL", proc.pid, grace_s
            )
        _signal(proc, signal.SIGKILL)
    left = wait_gone(alive, confirm_s)
    for proc in left:
        log.error("pid %d still running %g s after SIGKILL", proc.pid, confirm_s)
    return Stopped(
        terminated=tuple(sorted(p.pid for p in first)),
        killed=tuple(sorted(p.pid for p in alive)),
        left=tuple(sorted(p.pid for p in left)),
        grace_s=grace_s,
        seconds=time.monotonic() - started,
    )


def require_gone(stopped: Stopped, what: str) -> Stopped:
    """``stopped`` when every process is gone.

    Raises:
        NotStopped: some are still running; the message names ``what`` and their pids,
            and says that nothing is started again in their place.
    """
    if not stopped.gone:
        raise NotStopped(
            f"{what}: pids {list(stopped.left)} still running {CONFIRM_TIMEOUT_S:g} s after "
            "SIGKILL (uninterruptible sleep: a hung driver or file system call?); nothing "
            "was started in their place"
        )
    return stopped


def running(proc: psutil.Process) -> bool:
    """Whether ``proc`` (pid and start time) still runs; a zombie does not."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone while asked
        return False


def with_descendants(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """``procs`` and every live descendant of each (a rank's data-loader workers), by pid.

    Collect them *before* the first signal: a rank killed first leaves its workers to init,
    where no later walk from the rank finds them.
    """
    found: dict[int, psutil.Process] = {}
    for proc in procs:
        found.setdefault(proc.pid, proc)
        try:
            for child in proc.children(recursive=True):
                found.setdefault(child.pid, child)
        except psutil.Error:  # gone meanwhile: no children to collect
            continue
    return [found[pid] for pid in sorted(found)]


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after up to ``timeout`` seconds (step 4 alone, e.g.
    after a kill that a fault sent itself).

    This process's own children are reaped here (``wait_procs``); an orphan stays a
    zombie until init reaps it (seconds on the lab machine), and counts as gone.
    """
    deadline = time.monotonic() + timeout
    while True:
        procs = [p for p in procs if running(p)]
        if procs:
            _, procs = psutil.wait_procs(procs, timeout=POLL_S if timeout > 0 else 0)
            procs = [p for p in procs if running(p)]
        if not procs or time.monotonic() >= deadline:
            return procs


def _signal(proc: psutil.Process, sig: signal.Signals) -> None:
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:  # gone already: nothing to signal
        pass
    except psutil.AccessDenied as exc:
        raise NotStopped(f"not allowed to signal pid {proc.pid}: {exc}") from exc


__all__ = [
    "CONFIRM_TIMEOUT_S",
    "DEFAULT_GRACE_PERIOD_S",
    "MAX_GRACE_PERIOD_S",
    "GracePeriod",
    "Stopped",
    "require_gone",
    "running",
    "stop_processes",
    "wait_gone",
    "with_descendants",
]
