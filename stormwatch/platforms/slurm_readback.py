"""Bounded waits for Slurm's own state: how the Slurm backend verifies each action.

Every action of :class:`~stormwatch.platforms.slurm.SlurmBackend` is followed by a read
of what slurmctld now reports (``scontrol --oneliner show job|node`` through
:class:`~stormwatch.platforms.slurm.SlurmCommands`) until the effect shows or
:attr:`SlurmWait.timeout_s` passes; then :class:`BackendError` says what was last seen.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stormwatch.platforms.errors import BackendError, NotStopped
from stormwatch.platforms.stopping import DEFAULT_GRACE_PERIOD_S

if TYPE_CHECKING:
    from stormwatch.platforms.slurm import SlurmCommands, SlurmJobInfo, SlurmNodeInfo

#: Seconds an action waits for its effect. A requeued job given an early ``StartTime``
#: runs again 2-3 s after the requeue on the lab's cluster (tests/platforms/
#: test_slurm_live.py); a site's main scheduler may only look every ``sched_interval``
#: (60 s by default, slurm.conf(5)), so a minute.
READBACK_TIMEOUT_S = 60.0
#: Seconds between two reads (one ``scontrol`` call each, milliseconds on a local controller).
READBACK_POLL_S = 0.1
#: Seconds between two ``StartTime`` updates of a job still PENDING after the first.
NUDGE_S = 1.0
#: A requeued job starts this long after its requeue (``SubmitTime``), not at once: a
#: requeue revokes the job's credential on its nodes, and slurmd refuses a new credential
#: stamped in the same second ("Killing non-startable batch JobId=1: Job credential
#: revoked", then the job FAILED: seen on the lab's cluster whenever the restart fell in
#: the requeue's second). One second past that one leaves the kill RPC time to arrive.
CREDENTIAL_GAP_S = 2.0


def describe_job(info: SlurmJobInfo) -> str:
    """The fields an action waits on, as Slurm names them (for error messages)."""
    return (
        f"JobState={info.state} Reason={info.reason or 'None'} Restarts={info.restarts} "
        f"NodeList={info.nodes or '(null)'} ExcNodeList={info.excluded or '(null)'}"
    )


def describe_node(info: SlurmNodeInfo) -> str:
    """A node's ``State`` and ``Reason`` as Slurm prints them (for error messages)."""
    return f"State={info.state} Reason={info.reason or '(null)'}"


@dataclass(frozen=True, kw_only=True)
class SlurmWait:
    """Polls one job or node until a condition holds, at most :attr:`timeout_s`.

    Attributes:
        timeout_s: longest wait per condition (:data:`READBACK_TIMEOUT_S`).
        poll_s: seconds between reads (:data:`READBACK_POLL_S`).
        clock: monotonic seconds (a seam for tests).
        sleep: sleeps that many seconds (a seam for tests).
    """

    timeout_s: float = READBACK_TIMEOUT_S
    poll_s: float = READBACK_POLL_S
    clock: Callable[[], float] = field(default=time.monotonic)
    sleep: Callable[[float], None] = field(default=time.sleep)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.poll_s <= 0:
            raise BackendError(
                f"SlurmWait: timeout_s and poll_s must be > 0 (got {self.timeout_s}, {self.poll_s})"
            )

    def job(
        self,
        commands: SlurmCommands,
        job_id: str,
        done: Callable[[SlurmJobInfo], bool],
        what: str,
        *,
        nudge: Callable[[SlurmJobInfo], None] | None = None,
    ) -> SlurmJobInfo:
        """Read job ``job_id`` until ``done(info)``; between reads call ``nudge(info)``.

        Returns:
            The job as last read (``done`` holds).

        Raises:
            BackendError: not ``what`` within :attr:`timeout_s` (the last state read is
                in the message), or the job cannot be read.
        """
        deadline = self.clock() + self.timeout_s
        while True:
            info = commands.job(job_id)
            if done(info):
                return info
            if self.clock() >= deadline:
                raise BackendError(
                    f"Slurm job {job_id} not {what} after {self.timeout_s:g} s "
                    f"(last read: {describe_job(info)})"
                )
            if nudge is not None:
                nudge(info)
            self.sleep(self.poll_s)

    def node(
        self, commands: SlurmCommands, node: str, done: Callable[[SlurmNodeInfo], bool], what: str
    ) -> SlurmNodeInfo:
        """Read node ``node`` until ``done(info)``.

        Raises:
            BackendError: not ``what`` within :attr:`timeout_s` (its last state in the
                message), Slurm does not know the node, or it cannot be read.
        """
        deadline = self.clock() + self.timeout_s
        while True:
            info = commands.nodes(node).get(node)
            if info is None:
                raise BackendError(f"Slurm node {node}: not known to slurmctld")
            if done(info):
                return info
            if self.clock() >= deadline:
                raise BackendError(
                    f"Slurm node {node} not {what} after {self.timeout_s:g} s "
                    f"(last read: {describe_node(info)})"
                )
            self.sleep(self.poll_s)

    def elapsed_since(self, start: float) -> float:
        """Seconds since ``start`` (a :attr:`clock` reading)."""
        return self.clock() - start


@dataclass(frozen=True, kw_only=True)
class SlurmStop:
    """How a requeue confirms the job's old run gone before it starts again (:mod:`.stopping`).

    Attributes:
        grace_s: the grace period (s): the wait for the old run to go is this plus
            :attr:`SlurmWait.timeout_s` (Slurm's own SIGKILL comes after ``KillWait``,
            which a target file's check keeps within it).
        leftovers: ``leftovers(job_id)`` stops and confirms gone the processes of the old
            run that Slurm no longer tracks (orphans re-parented away from their step; the
            lab, which sees every process, passes one); returns what it did, raises
            :class:`~.errors.NotStopped`. None: Slurm's word is taken.
    """

    grace_s: float = DEFAULT_GRACE_PERIOD_S
    leftovers: Callable[[str], str] | None = None


def requeue_and_start(
    commands: SlurmCommands,
    wait: SlurmWait,
    job_id: str,
    exclude: str | None = None,
    stop: SlurmStop | None = None,
) -> SlurmJobInfo:
    """Requeue job ``job_id``, confirm its old processes gone, start it at once, read back
    RUNNING again.

    ``scontrol requeue`` (slurmd sends the job's processes SIGTERM, SIGKILL after
    ``KillWait``, and reports the job complete once they are gone); then
    :func:`wait_old_run_gone`: PENDING (not COMPLETING) with no step left, within the
    ``stop``'s grace period + ``wait.timeout_s``, and its ``leftovers(job_id)`` (processes
    of the old run that Slurm no longer tracks, stopped and confirmed gone: the lab's);
    only then add ``exclude`` to its ``ExcNodeList`` and ``scontrol update StartTime=<the
    requeue's SubmitTime + CREDENTIAL_GAP_S>`` (``now`` without a SubmitTime; sent again
    each second while it still waits: a requeued job otherwise waits for its ``BeginTime``,
    ``cred_expire + 1`` s); then wait for RUNNING with a restart more (or a new start
    time) on nodes without ``exclude``, its batch step launched (``<id>.batch`` in
    ``squeue --steps``: a slurmd that refuses the launch fails the job instead).

    Returns:
        The job as last read (RUNNING).

    Raises:
        NotStopped: the old run's processes were not confirmed gone (nothing was started).
        BackendError: a command failed, or the job was not RUNNING again within
            ``wait.timeout_s`` (the state seen in the message).
    """
    before = commands.job(job_id)
    commands.requeue(job_id)

    def restarted(info: SlurmJobInfo) -> bool:
        return info.restarts > before.restarts or info.start_time != before.start_time

    stop = stop or SlurmStop()
    pending = wait_old_run_gone(commands, wait, job_id, restarted, grace_s=stop.grace_s)
    if stop.leftovers is not None and pending.state == "PENDING":
        stop.leftovers(job_id)
    requeued = pending.submit_time
    begin = "now" if requeued is None else _slurm_stamp(requeued + CREDENTIAL_GAP_S)
    if pending.state == "PENDING":
        if exclude is not None:
            excluded = ",".join(n for n in (pending.excluded, exclude) if n)
            commands.update_job(job_id, ExcNodeList=excluded)
        commands.update_job(job_id, StartTime=begin)
    nudged = [wait.clock()]

    def start_now(info: SlurmJobInfo) -> None:
        if info.state == "PENDING" and wait.clock() - nudged[0] >= NUDGE_S:
            nudged[0] = wait.clock()
            commands.update_job(job_id, StartTime=begin)

    def back(info: SlurmJobInfo) -> bool:
        if info.state != "RUNNING" or not restarted(info):
            return False
        if exclude is not None and exclude in commands.hostnames(info.nodes):
            return False
        return f"{job_id}.batch" in commands.step_ids(job_id)

    without = f" without {exclude}" if exclude else ""
    return wait.job(
        commands, job_id, back, f"RUNNING again{without} with its batch step", nudge=start_now
    )


def wait_old_run_gone(
    commands: SlurmCommands,
    wait: SlurmWait,
    job_id: str,
    restarted: Callable[[SlurmJobInfo], bool],
    *,
    grace_s: float,
) -> SlurmJobInfo:
    """Read a requeued job until its old run is gone: PENDING (slurmd reported every
    process of it gone: the job leaves COMPLETING only then) and no step of it left in
    ``squeue --steps``; or RUNNING again already (``restarted``), which Slurm allows
    only after the same. An update sent while it is still COMPLETING is lost.

    Returns:
        The job as last read.

    Raises:
        NotStopped: not so within ``grace_s`` (Slurm's SIGKILL comes after ``KillWait``)
            plus ``wait.timeout_s`` (slurmd's kill, its epilog and its message); the last
            state read and the steps left are in the message.
    """
    bound = grace_s + wait.timeout_s
    deadline = wait.clock() + bound
    while True:
        info = commands.job(job_id)
        if info.state == "RUNNING" and restarted(info):
            return info
        steps = commands.step_ids(job_id) if info.state == "PENDING" else []
        if info.state == "PENDING" and not steps:
            return info
        if wait.clock() >= deadline:
            left = f"; steps left: {', '.join(steps)}" if steps else ""
            raise NotStopped(
                f"Slurm job {job_id}: its processes not confirmed gone {bound:g} s after the "
                f"requeue (grace period {grace_s:g} s; last read: {describe_job(info)}{left}); "
                "not started again. Check slurmd's log on its nodes (unkillable processes?)"
            )
        wait.sleep(wait.poll_s)


def _slurm_stamp(at: float) -> str:
    """``at`` (Unix s) as Slurm reads a time: ``2026-12-02T03:42:25``, local time."""
    return dt.datetime.fromtimestamp(at).strftime("%Y-%m-%dT%H:%M:%S")


def drained(node: SlurmNodeInfo) -> bool:
    """DRAIN flag (IDLE+DRAIN, ALLOCATED+DRAIN ...) or a DRAINED/DRAINING base state."""
    return "DRAIN" in node.flags or node.base_state in ("DRAINED", "DRAINING")


def in_service(node: SlurmNodeInfo) -> bool:
    """IDLE, MIXED or ALLOCATED without DRAIN, NOT_RESPONDING, DOWN or FAIL flags."""
    return node.base_state in ("IDLE", "MIXED", "ALLOCATED") and not (
        node.flags & {"DRAIN", "NOT_RESPONDING", "DOWN", "FAIL"}
    )


__all__ = [
    "CREDENTIAL_GAP_S",
    "NUDGE_S",
    "READBACK_POLL_S",
    "READBACK_TIMEOUT_S",
    "SlurmStop",
    "SlurmWait",
    "describe_job",
    "describe_node",
    "drained",
    "in_service",
    "requeue_and_start",
    "wait_old_run_gone",
]
