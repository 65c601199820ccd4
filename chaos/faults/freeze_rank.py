"""``freeze_rank``: SIGSTOP one rank's worker; revert sends SIGCONT (controller-side).

The lab's processes share one PID namespace, so the controller signals the
worker itself. The target is the pid *and* its start time: a recycled pid is
never signalled. :func:`find_rank_process` finds a worker by the environment
torchrun gives it (``STORMWATCH_JOB``, ``RANK``).
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from stormwatch.chaos.errors import FaultError
from stormwatch.chaos.faults.base import FaultTarget, InjectionResult
from stormwatch.chaos.faults.specs import FreezeRankFault

#: Nothing outside the controller reverts this fault: the runner starts a reaper for its TTL.
REVERTS_ITSELF = False


def find_rank_process(job: str, rank: int) -> psutil.Process:
    """The worker process of ``rank`` in ``job`` (topmost process with that environment).

    Raises:
        FaultError: no such process, or more than one candidate.
    """
    matches: list[psutil.Process] = []
    for process in psutil.process_iter(["pid", "ppid"]):
        try:
            env = process.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("STORMWATCH_JOB") == job and env.get("RANK") == str(rank):
            matches.append(process)
    pids = {p.pid for p in matches}
    top = [p for p in matches if p.info.get("ppid") not in pids]
    if not top:
        raise FaultError(f"no process of job {job!r} rank {rank} is running on this host")
    if len(top) > 1:
        raise FaultError(
            f"{len(top)} processes claim job {job!r} rank {rank}: {sorted(p.pid for p in top)}"
        )
    return top[0]


def _same_process(pid: int, create_time: float) -> psutil.Process | None:
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - create_time) < 0.01:
            return process
    except psutil.Error:
        pass
    return None


class FreezeRank:
    """A ``freeze_rank`` fault bound to its id and process.

    Args:
        fault_id: ledger id.
        spec: the fault from the experiment.
        target: must name ``pid`` and ``pid_create_time``.
    """

    reverts_itself = REVERTS_ITSELF

    def __init__(self, *, fault_id: str, spec: FreezeRankFault, target: FaultTarget) -> None:
        if target.pid is None or target.pid_create_time is None:
            raise FaultError(f"fault {fault_id}: freeze_rank needs the target pid and start time")
        self.fault_id = fault_id
        self.spec = spec
        self.target = target

    async def inject(self) -> InjectionResult:
        """SIGSTOP the process.

        Raises:
            FaultError: the process is gone or cannot be signalled.
        """
        assert self.target.pid is not None and self.target.pid_create_time is not None
        if _same_process(self.target.pid, self.target.pid_create_time) is None:
            raise FaultError(f"fault {self.fault_id}: rank process {self.target.pid} is gone")
        try:
            os.kill(self.target.pid, signal.SIGSTOP)
        except OSError as exc:
            raise FaultError(f"fault {self.fault_id}: SIGSTOP {self.target.pid}: {exc}") from exc
        now = time.time()
        return InjectionResult(
            applied_at=now,
            expires_at=now + self.spec.ttl_seconds,
            target_pid=self.target.pid,
            detail=f"SIGSTOP to rank {self.spec.rank} (pid {self.target.pid})",
        )

    async def revert(self) -> str:
        """SIGCONT the process if it is still the same one (idempotent; a gone process is fine).

        Raises:
            FaultError: the process exists but cannot be signalled.
        """
        assert self.target.pid is not None and self.target.pid_create_time is not None
        if _same_process(self.target.pid, self.target.pid_create_time) is None:
            return f"process {self.target.pid} is gone; nothing to continue"
        try:
            os.kill(self.target.pid, signal.SIGCONT)
        except ProcessLookupError:
            return f"process {self.target.pid} is gone; nothing to continue"
        except OSError as exc:
            raise FaultError(f"fault {self.fault_id}: SIGCONT {self.target.pid}: {exc}") from exc
        return f"SIGCONT sent to pid {self.target.pid}"


__all__ = ["FreezeRank", "find_rank_process"]
