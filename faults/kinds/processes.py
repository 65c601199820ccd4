"""Process faults beyond ``kill_rank``: torchrun, a whole node, the rendezvous host, the agent,
and freezing (SIGSTOP) ranks with SIGCONT at the TTL.

What each models in production:

* ``kill_torchrun``: the node's torchrun (elastic agent) dies, e.g. OOM-killed on
  the host; its workers are orphaned and the rendezvous loses a member. The ranks it
  orphans are recorded, and its revert stops what is left of them (:mod:`.orphans`).
* ``kill_node_processes``: every training process of the node dies at once
  (torchrun and all its descendants, and the job's ranks whose launcher was gone
  already, with theirs): a node lost to a kernel panic or a preemption, as far as the
  job can tell.
* ``kill_rdzv_host``: the torchrun that serves the c10d rendezvous store (the
  one listening on ``--rdzv-endpoint``'s port, ``is_host=1``) dies: every other
  node loses the store. Only the host node's agent accepts it (404 elsewhere).
* ``kill_agent``: the stormwatch agent itself dies (a monitoring blind spot:
  ``StormwatchAgentProcessDown`` must fire, training must not care). The agent answers
  first, then signals itself ``delay_seconds`` later; a kill needs no revert,
  and a restarted agent finds the record and closes it at its TTL.
* ``freeze_ranks``: SIGSTOP of one rank, or of every rank of the node (with
  ``include_torchrun``, the node's torchrun too): a hung process or host
  (D-state I/O, a stuck driver call). The *agent* sends SIGCONT at the TTL, so
  the freeze ends even if the controller died; revert checks that no frozen
  process is still stopped and fails loudly otherwise.

Kills are final: their ``revert`` only records completion (``kill_torchrun``'s also stops
the ranks it orphaned). Every process is
identified by ``[pid, create_time]`` in the ledger, so a reused pid is never
signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, ClassVar, Literal, TypeVar

import psutil
from pydantic import Field

from stormwatch.faults.base import Fault, FaultRequest, Injection
from stormwatch.faults.errors import FaultError, FaultTargetAmbiguous, FaultTargetNotFound
from stormwatch.faults.kind import Blast, DetectClass, FaultKind, Placement, Target, Traits
from stormwatch.faults.kinds import orphans
from stormwatch.faults.limits import JobName, Rank, Signal
from stormwatch.faults.node import FaultContext, RankSeen
from stormwatch.faults.system import (
    job_orphans,
    job_ranks,
    option_value,
    process_ref,
    same_process,
    torchrun_of,
    torchruns,
    wait_continued,
    wait_stopped,
    wait_until,
)
from stormwatch.faults.targeting import AgentDirectory, NodeOrRank, NoTarget

#: How long ``kill_node_processes`` waits to see its SIGKILLed processes gone, seconds
#: (:data:`stormwatch.platforms.stopping.CONFIRM_TIMEOUT_S`).
KILL_CONFIRM_S = 5.0


class _JobKillRequest(FaultRequest):
    job: JobName | None = None
    signal: Signal = "SIGKILL"


class KillTorchrunRequest(_JobKillRequest):
    """``kill_torchrun``: ``job`` (optional), ``signal`` (SIGKILL)."""

    kind: Literal["kill_torchrun"]


class KillNodeProcessesRequest(_JobKillRequest):
    """``kill_node_processes``: ``job`` (optional: every job), ``signal`` (SIGKILL)."""

    kind: Literal["kill_node_processes"]


class KillRdzvHostRequest(_JobKillRequest):
    """``kill_rdzv_host``: ``job`` (optional), ``signal`` (SIGKILL)."""

    kind: Literal["kill_rdzv_host"]


class KillAgentRequest(FaultRequest):
    """``kill_agent``: ``signal`` (SIGKILL), ``delay_seconds`` (0.5: time to answer first;
    not in experiment files)."""

    kind: Literal["kill_agent"]
    signal: Signal = "SIGKILL"
    delay_seconds: float = Field(default=0.5, ge=0.1, le=60)


class FreezeRanksRequest(FaultRequest):
    """``freeze_ranks``: ``job``, ``ranks`` (None: every rank of the node), ``include_torchrun``."""

    kind: Literal["freeze_ranks"]
    job: JobName | None = None
    ranks: list[Rank] | None = Field(default=None, min_length=1)
    include_torchrun: bool = False


class NodeOrRanks(NodeOrRank):
    """``node`` or ``rank``; the agent of that node gets ``ranks: [rank]`` (freeze that rank)
    or no ``ranks`` (freeze every rank of the node)."""

    supplies: ClassVar[frozenset[str]] = frozenset({"ranks"})

    def targeting_fields(self, agents: AgentDirectory) -> dict[str, Any]:
        return {} if self.rank is None else {"ranks": [self.rank]}


def _single_job(ctx: FaultContext, job: str | None) -> list[psutil.Process]:
    ranks = job_ranks(ctx, job)
    jobs = sorted({r.job for r in ranks})
    if job is None and len(jobs) > 1:
        raise FaultTargetAmbiguous(
            f"several jobs run on node {ctx.node} ({', '.join(jobs)}); give 'job'"
        )
    agents = torchruns(ctx, ranks)
    if not agents:
        raise FaultTargetNotFound(f"no torchrun agent found above the ranks on node {ctx.node}")
    return agents


def _signal_all(processes: list[psutil.Process], name: str) -> list[list[float]]:
    sent = []
    for process in processes:
        try:
            ref = process_ref(process)
            process.send_signal(getattr(signal, name))
            sent.append(ref)
        except psutil.NoSuchProcess:
            continue
        except psutil.Error as exc:
            raise FaultError(f"cannot send {name} to pid {process.pid}: {exc}") from exc
    if not sent:
        raise FaultTargetNotFound("every target process exited before it could be signalled")
    return sent


_KillT = TypeVar("_KillT", bound=_JobKillRequest)


class _KillFault(Fault[_KillT]):
    """Shared shape: resolve processes in prepare, signal them in inject, nothing to revert."""

    def __init__(self, request: _KillT) -> None:
        super().__init__(request)
        self._targets: list[psutil.Process] = []

    def inject(self, ctx: FaultContext) -> Injection:
        name = self.request.signal
        sent = _signal_all(self._targets, name)
        return Injection(target_pid=int(sent[0][0]), details={"signal": name, "processes": sent})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> dict[str, Any] | None:
        """Nothing to undo: a kill is final."""
        return None


class KillTorchrun(_KillFault[KillTorchrunRequest]):
    """Kill the node's torchrun agent of one job; its ranks are left running, orphaned, and
    recorded (:mod:`.orphans`); the revert stops what is left of them."""

    def __init__(self, request: KillTorchrunRequest) -> None:
        super().__init__(request)
        self._ranks: list[RankSeen] = []

    def prepare(self, ctx: FaultContext) -> None:
        self._targets = _single_job(ctx, self.request.job)
        agents = {a.pid for a in self._targets}
        ranks = job_ranks(ctx, self.request.job)
        self._ranks = [r for r in ranks if getattr(torchrun_of(ctx, r.pid), "pid", 0) in agents]

    def inject(self, ctx: FaultContext) -> Injection:
        left = orphans.process_refs(self._ranks)  # before the kill: then they are init's
        done = super().inject(ctx)
        details = {
            **done.details,
            "job": self._ranks[0].job if self._ranks else self.request.job,
            "orphans": orphans.orphan_entries(self._ranks),
            "orphaned_processes": left,
        }
        return Injection(target_pid=done.target_pid, details=details)

    def revert(self, ctx: FaultContext, injection: Injection | None) -> dict[str, Any] | None:
        """Stop what is left of the ranks the kill orphaned (and of any other orphan of the
        job on this node): SIGTERM, :data:`.orphans.REAP_GRACE_S`, SIGKILL, confirmed gone;
        returns each orphan with what removed it.

        Raises:
            FaultError: one is still running after SIGKILL.
        """
        return None if injection is None else orphans.reap(ctx, injection.details)


class KillNodeProcesses(_KillFault[KillNodeProcessesRequest]):
    """Kill every torchrun agent of the node, then all their descendants, the ranks whose
    launcher is gone already (orphans) and theirs; a SIGKILL is confirmed (all gone)."""

    def __init__(self, request: KillNodeProcessesRequest) -> None:
        super().__init__(request)
        self._orphans: list[psutil.Process] = []

    def prepare(self, ctx: FaultContext) -> None:
        ranks = job_ranks(ctx, self.request.job)
        agents = torchruns(ctx, ranks)
        ranks_procs = []
        for info in ranks:  # ranks not under a found torchrun still count
            with contextlib.suppress(psutil.Error):  # gone meanwhile: nothing to stop
                ranks_procs.append(psutil.Process(info.pid))
        self._orphans = job_orphans(ctx, self.request.job)
        rest = orphans.descendants([*agents, *ranks_procs, *self._orphans])
        # torchrun first: killed, it cannot restart the workers killed next
        self._targets = agents + [p for p in rest if p.pid not in {a.pid for a in agents}]

    def inject(self, ctx: FaultContext) -> Injection:
        done = super().inject(ctx)
        details: dict[str, Any] = {**done.details, "orphans": [p.pid for p in self._orphans]}
        if self.request.signal == "SIGKILL":  # confirmed gone (not reaped: not our children)
            wait_until(lambda: not any(_alive(p) for p in self._targets), KILL_CONFIRM_S)
            details["left"] = [p.pid for p in self._targets if _alive(p)]
        return Injection(target_pid=done.target_pid, details=details)


class KillRdzvHost(_KillFault[KillRdzvHostRequest]):
    """Kill the torchrun that listens on the job's rendezvous port, when it is on this node."""

    def prepare(self, ctx: FaultContext) -> None:
        for agent in _single_job(ctx, self.request.job):
            try:
                cmdline = agent.cmdline()
                endpoint = option_value(cmdline, "--rdzv-endpoint", "--rdzv_endpoint")
                conf = option_value(cmdline, "--rdzv-conf", "--rdzv_conf") or ""
                port = int(endpoint.rsplit(":", 1)[1]) if endpoint and ":" in endpoint else None
                listening = port is not None and any(
                    c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                    for c in agent.net_connections(kind="tcp")
                )
            except (psutil.Error, ValueError):
                continue
            if listening or "is_host=1" in conf.split(","):
                self._targets = [agent]
                return
        raise FaultTargetNotFound(f"node {ctx.node} does not host the job's rendezvous store")


class KillAgent(Fault[KillAgentRequest]):
    """The agent signals itself after answering (a timer thread)."""

    def prepare(self, ctx: FaultContext) -> None:
        return None

    def inject(self, ctx: FaultContext) -> Injection:
        pid, number = os.getpid(), getattr(signal, self.request.signal)
        timer = threading.Timer(self.request.delay_seconds, os.kill, args=(pid, number))
        timer.daemon = True
        timer.start()
        return Injection(target_pid=pid, details={"signal": self.request.signal})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Nothing to undo: the agent is (or was) dead; a supervisor restarts it."""
        return None


class FreezeRanks(Fault[FreezeRanksRequest]):
    """SIGSTOP ranks (and their descendants; optionally torchrun); SIGCONT on revert."""

    def __init__(self, request: FreezeRanksRequest) -> None:
        super().__init__(request)
        self._targets: list[psutil.Process] = []

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.request
        ranks = job_ranks(ctx, spec.job)
        if spec.ranks is not None:
            missing = sorted(set(spec.ranks) - {r.rank for r in ranks})
            if missing:
                raise FaultTargetNotFound(f"rank(s) {missing} not running on node {ctx.node}")
            ranks = [r for r in ranks if r.rank in spec.ranks]
        if spec.job is None and len({r.job for r in ranks}) > 1:
            raise FaultTargetAmbiguous(f"several jobs run on node {ctx.node}; give 'job'")
        targets: dict[int, psutil.Process] = {}
        for info in ranks:
            try:
                process = psutil.Process(info.pid)
                targets[process.pid] = process
                targets.update((c.pid, c) for c in process.children(recursive=True))
            except psutil.Error:
                continue
        agents = torchruns(ctx, ranks) if spec.include_torchrun else []
        self._targets = agents + [targets[pid] for pid in sorted(targets)]

    def inject(self, ctx: FaultContext) -> Injection:
        try:
            sent = _signal_all(self._targets, "SIGSTOP")
        except FaultError:
            for process in self._targets:  # nothing half-applied: continue what was stopped
                with contextlib.suppress(psutil.Error):  # gone: nothing to continue
                    process.send_signal(signal.SIGCONT)
            raise
        # the signal is asynchronous: answer once the processes are seen stopped; one in
        # uninterruptible sleep (I/O) stops when its call returns: recorded, not refused
        late = wait_stopped([p for ref in sent if (p := same_process(ref)) is not None])
        details: dict[str, Any] = {"processes": sent}
        if late:
            details["not_yet_stopped"] = late
        return Injection(target_pid=int(sent[-1][0]), details=details)

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """SIGCONT every recorded process still alive; then :meth:`verify`.

        Without an injection (crash between ledger and signal) nothing was recorded as
        stopped, so there is nothing to continue.

        Raises:
            FaultError: a process cannot be continued, or is still stopped.
        """
        for process in _recorded(injection):
            try:
                process.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                continue
            except psutil.Error as exc:
                raise FaultError(f"cannot SIGCONT pid {process.pid}: {exc}") from exc
        self.verify(ctx, injection)

    def verify(self, ctx: FaultContext, injection: Injection | None) -> None:
        """No recorded process is still stopped (waiting up to ``SIGNAL_SETTLE_S``).

        Raises:
            FaultError: naming the pids still stopped.
        """
        still = wait_continued(_recorded(injection))
        if still:
            raise FaultError(f"processes still stopped after SIGCONT: {still}")


def _recorded(injection: Injection | None) -> list[psutil.Process]:
    """The processes an injection recorded that still run (none without an injection)."""
    if injection is None:
        return []
    return [p for ref in injection.details.get("processes", []) if (p := same_process(ref))]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False  # gone


KILL_TORCHRUN = FaultKind(
    kind="kill_torchrun",
    summary="Kill the node's torchrun agent (the launcher dies; its workers lose their parent).",
    traits=Traits(
        target=Target.NODE_OR_RANK,
        placement=Placement.ONE_NODE,
        category="software_bug",  # the node's launcher crashed
        detect_class=DetectClass.NODE_LOST,  # the node leaves the job's rendezvous
        final=True,
        job_scoped=True,
    ),
    targeting=NodeOrRank,
    request=KillTorchrunRequest,
    fault=KillTorchrun,
)
KILL_NODE_PROCESSES = FaultKind(
    kind="kill_node_processes",
    summary="Kill every training process on a node (torchrun and all its workers): a node lost.",
    traits=Traits(
        target=Target.NODE_OR_RANK,
        placement=Placement.ONE_NODE,
        category="host_maintenance",  # a node gone from the job
        detect_class=DetectClass.NODE_LOST,
        final=True,
        job_scoped=True,
    ),
    targeting=NodeOrRank,
    request=KillNodeProcessesRequest,
    fault=KillNodeProcesses,
)
KILL_RDZV_HOST = FaultKind(
    kind="kill_rdzv_host",
    summary=(
        "Kill the torchrun that hosts the job's rendezvous (c10d) store; the controller asks "
        "every agent, only the host's answers."
    ),
    traits=Traits(
        target=Target.NONE,
        placement=Placement.EVERY_AGENT,
        blast=Blast.FIRST_NODE,
        category="dependency",  # the rendezvous store's host died
        detect_class=DetectClass.NODE_LOST,  # its torchrun and ranks leave the job with it
        final=True,
        job_scoped=True,
        fixed_place="it always hits the node hosting the rendezvous store",
    ),
    targeting=NoTarget,
    request=KillRdzvHostRequest,
    fault=KillRdzvHost,
)
KILL_AGENT = FaultKind(
    kind="kill_agent",
    summary="Kill the node's stormwatch agent itself (monitoring blind spot: StormwatchAgentProcessDown).",
    traits=Traits(
        target=Target.NODE_OR_RANK,
        placement=Placement.ONE_NODE,
        blast=Blast.NOTHING,  # monitoring only: training is not touched
        detect_class=DetectClass.AGENT_DOWN,
        final=True,
        reverts_itself=False,  # a dead agent reverts nothing: the reaper restarts it
        kills_agent=True,
    ),
    targeting=NodeOrRank,
    request=KillAgentRequest,
    fault=KillAgent,
    agent_only=frozenset({"delay_seconds"}),
)
FREEZE_RANKS = FaultKind(
    kind="freeze_ranks",
    summary=(
        "Agent-side SIGSTOP of one rank (``rank``) or of every rank on a node (``node``): a "
        "hung process or host; SIGCONT at the TTL, by the agent, even if the controller died. "
        "``include_torchrun`` also stops the node's torchrun agent (a whole hung host)."
    ),
    traits=Traits(
        target=Target.NODE_OR_RANK,
        placement=Placement.ONE_NODE,
        category="nccl_watchdog_timeouts",  # peers block in a collective until the watchdog
        detect_class=DetectClass.HUNG_RANK,
        job_scoped=True,
    ),
    targeting=NodeOrRanks,
    request=FreezeRanksRequest,
    fault=FreezeRanks,
)

__all__ = [
    "FREEZE_RANKS",
    "KILL_AGENT",
    "KILL_NODE_PROCESSES",
    "KILL_RDZV_HOST",
    "KILL_TORCHRUN",
    "FreezeRanks",
    "FreezeRanksRequest",
    "KillAgent",
    "KillAgentRequest",
    "KillNodeProcesses",
    "KillNodeProcessesRequest",
    "KillRdzvHost",
    "KillRdzvHostRequest",
    "KillTorchrun",
    "KillTorchrunRequest",
    "NodeOrRanks",
]
