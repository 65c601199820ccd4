"""``kill_rank``: send SIGKILL or SIGTERM to a training rank on this node.

Models a crashed process (segfault, OOM kill, ``kill -9``). The target is the
rank's process as found by the rank watcher (a descendant of a torchrun agent
with the rank's environment, claimed by this node). Right before the signal,
ownership is checked again from fresh reads (same start time, same rank
environment, still this node's: ``RankDirectory.check_owned``); a process that is
no longer a claimed rank of this node is refused (404 with the reason), and
psutil's ``send_signal`` refuses a pid reused since. A kill cannot be undone:
``revert`` does nothing, and the ledger records the fault as completed when its
TTL ends (torchrun, not the agent, restarts the rank). The controller asks the
agent of the node holding the rank directly (``Placement.RANK_AGENT``).
"""

from __future__ import annotations

import signal
from typing import Literal

import psutil

from stormwatch.faults.base import Fault, FaultRequest, Injection
from stormwatch.faults.errors import FaultError, FaultTargetAmbiguous, FaultTargetNotFound
from stormwatch.faults.kind import DetectClass, FaultKind, Placement, Target, Traits
from stormwatch.faults.limits import JobName, Rank, Signal
from stormwatch.faults.node import FaultContext
from stormwatch.faults.targeting import RankTarget


class KillRankRequest(FaultRequest):
    """Request body of a ``kill_rank`` fault.

    Attributes:
        rank: global rank to kill.
        job: the rank's job (``STORMWATCH_JOB``); needed only when several jobs
            run on the node.
        signal: ``SIGKILL`` (default: a crash) or ``SIGTERM`` (a graceful stop).
    """

    kind: Literal["kill_rank"]
    rank: Rank
    job: JobName | None = None
    signal: Signal = "SIGKILL"


class KillRank(Fault[KillRankRequest]):
    """Kill one rank's process."""

    def __init__(self, request: KillRankRequest) -> None:
        super().__init__(request)
        self._process: psutil.Process | None = None
        self._job: str | None = None
        self._started_at = 0.0

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.request
        matches = ctx.ranks.alive(spec.rank, spec.job)
        if not matches:
            ctx.ranks.scan()  # the rank may have started since the last scan
            matches = ctx.ranks.alive(spec.rank, spec.job)
        where = f"rank {spec.rank}" + (f" of job {spec.job}" if spec.job else "")
        if not matches:
            raise FaultTargetNotFound(f"{where} is not running on node {ctx.node}")
        if len(matches) > 1:
            jobs = ", ".join(sorted(info.job for info, _ in matches))
            raise FaultTargetAmbiguous(f"{where} runs in several jobs ({jobs}); give 'job'")
        info, process = matches[0]
        self._process, self._job, self._started_at = process, info.job, info.started_at

    def inject(self, ctx: FaultContext) -> Injection:
        if self._process is None:
            raise FaultError("kill_rank: inject() before prepare()")
        spec = self.request
        assert self._job is not None
        why = ctx.ranks.check_owned(self._process.pid, self._started_at, (self._job, spec.rank))
        if why is not None:
            raise FaultTargetNotFound(f"refusing to signal rank {spec.rank}: {why}")
        try:
            if self._process.status() == psutil.STATUS_ZOMBIE:  # dead, not yet reaped
                raise psutil.NoSuchProcess(self._process.pid)
            # A SIGTERM from a fault is a crash to detect, not a stop request to excuse.
            ctx.ranks.note_fault_signal(self._process.pid)
            self._process.send_signal(getattr(signal, spec.signal))
        except psutil.NoSuchProcess as exc:
            ctx.ranks.note_fault_signal(self._process.pid, sent=False)
            raise FaultTargetNotFound(
                f"rank {spec.rank} (pid {self._process.pid}) exited before it could be signalled"
            ) from exc
        except psutil.Error as exc:
            ctx.ranks.note_fault_signal(self._process.pid, sent=False)
            raise FaultError(f"kill_rank: cannot signal pid {self._process.pid}: {exc}") from exc
        return Injection(
            target_pid=self._process.pid,
            details={"signal": spec.signal, "job": self._job, "rank": spec.rank},
        )

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Nothing to undo: the process is gone; torchrun decides whether it comes back."""
        return None


KILL_RANK = FaultKind(
    kind="kill_rank",
    summary=(
        "Kill one rank's worker (a crashed process: segfault, OOM kill, ``kill -9``). The kill "
        "itself cannot be undone; torchrun is expected to restart the workers. ``ttl_seconds`` "
        "bounds the agent-side fault record."
    ),
    traits=Traits(
        target=Target.RANK,
        placement=Placement.RANK_AGENT,
        category="software_bug",  # a crashed training process
        detect_class=DetectClass.RANK_KILLED,
        final=True,
        job_scoped=True,
    ),
    targeting=RankTarget,
    request=KillRankRequest,
    fault=KillRank,
    ttl_default=300.0,
)

__all__ = ["KILL_RANK", "KillRank", "KillRankRequest"]
