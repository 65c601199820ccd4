"""Process faults beyond ``kill_rank``: torchrun, a whole node, the rendezvous host, the agent,
and freezing (SIGSTOP) ranks with SIGCONT at the TTL.

What each models in production:

* ``kill_torchrun``: the node's torchrun (elastic agent) dies, e.g. OOM-killed on
  the host; its workers are orphaned and the rendezvous loses a member.
* ``kill_node_processes``: every training process of the node dies at once
  (torchrun and all its descendants): a node lost to a kernel panic or a
  preemption, as far as the job can tell.
* ``kill_rdzv_host``: the torchrun that serves the c10d rendezvous store (the
  one listening on ``--rdzv-endpoint``'s port, ``is_host=1``) dies: every other
  node loses the store. Only the host node's agent accepts it (404 elsewhere).
* ``kill_agent``: the stormwatch agent itself dies (a monitoring blind spot:
  ``StormwatchAgentDown`` must fire, training must not care). The agent answers
  first, then signals itself ``delay_seconds`` later; a kill needs no revert,
  and a restarted agent finds the record and closes it at its TTL.
* ``freeze_ranks``: SIGSTOP of one rank, or of every rank of the node (with
  ``include_torchrun``, the node's torchrun too): a hung process or host
  (D-state I/O, a stuck driver call). The *agent* sends SIGCONT at the TTL, so
  the freeze ends even if the controller died; revert checks that no frozen
  process is still stopped and fails loudly otherwise.

Kills are final: their ``revert`` only records completion. Every process is
identified by ``[pid, create_time]`` in the ledger, so a reused pid is never
signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Literal

import psutil
from pydantic import Field

from stormwatch.agent.errors import FaultError, FaultTargetAmbiguous, FaultTargetNotFound
from stormwatch.agent.faults._system import (
    job_ranks,
    option_value,
    process_ref,
    same_process,
    torchruns,
    wait_until,
)
from stormwatch.agent.faults.base import Fault, FaultContext, FaultSpec, Injection

Signal = Literal["SIGKILL", "SIGTERM"]
#: How long revert waits for SIGCONT to show (process state leaves ``T``), seconds.
CONTINUE_TIMEOUT_S = 2.0


class _JobSpec(FaultSpec):
    job: str | None = Field(default=None, min_length=1)


class KillTorchrunSpec(_JobSpec):
    """``kill_torchrun``: ``job`` (optional), ``signal`` (SIGKILL)."""

    kind: Literal["kill_torchrun"]
    signal: Signal = "SIGKILL"


class KillNodeProcessesSpec(_JobSpec):
    """``kill_node_processes``: ``job`` (optional: every job), ``signal`` (SIGKILL)."""

    kind: Literal["kill_node_processes"]
    signal: Signal = "SIGKILL"


class KillRdzvHostSpec(_JobSpec):
    """``kill_rdzv_host``: ``job`` (optional), ``signal`` (SIGKILL)."""

    kind: Literal["kill_rdzv_host"]
    signal: Signal = "SIGKILL"


class KillAgentSpec(FaultSpec):
    """``kill_agent``: ``signal`` (SIGKILL), ``delay_seconds`` (0.5: time to answer first)."""

    kind: Literal["kill_agent"]
    signal: Signal = "SIGKILL"
    delay_seconds: float = Field(default=0.5, ge=0.1, le=60)


class FreezeRanksSpec(_JobSpec):
    """``freeze_ranks``: ``ranks`` (None: every rank of the node), ``include_torchrun``."""

    kind: Literal["freeze_ranks"]
    ranks: list[int] | None = Field(default=None, min_length=1)
    include_torchrun: bool = False


def _single_job(ctx: FaultContext, job: str | None) -> list[psutil.Process]:
    ranks = job_ranks(ctx, job)
    jobs = sorted({r.job for r in ranks})
    if job is None and len(jobs) > 1:
        raise FaultTargetAmbiguous(
            f"several jobs run on node {ctx.node} ({', '.join(jobs)}); give 'job'"
        )
    agents = torchruns(ranks)
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


class _KillFault(Fault):
    """Shared shape: resolve processes in prepare, signal them in inject, nothing to revert."""

    def __init__(self, spec: FaultSpec) -> None:
        super().__init__(spec)
        self._targets: list[psutil.Process] = []

    def inject(self, ctx: FaultContext) -> Injection:
        name = getattr(self.spec, "signal", "SIGKILL")
        sent = _signal_all(self._targets, name)
        return Injection(target_pid=int(sent[0][0]), details={"signal": name, "processes": sent})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Nothing to undo: a kill is final."""
        return None


class KillTorchrun(_KillFault):
    """Kill the node's torchrun agent of one job."""

    kind = "kill_torchrun"
    spec_type = KillTorchrunSpec

    def prepare(self, ctx: FaultContext) -> None:
        assert isinstance(self.spec, KillTorchrunSpec)
        self._targets = _single_job(ctx, self.spec.job)


class KillNodeProcesses(_KillFault):
    """Kill every torchrun agent of the node, then all their descendants."""

    kind = "kill_node_processes"
    spec_type = KillNodeProcessesSpec

    def prepare(self, ctx: FaultContext) -> None:
        assert isinstance(self.spec, KillNodeProcessesSpec)
        ranks = job_ranks(ctx, self.spec.job)
        agents = torchruns(ranks)
        everything: dict[int, psutil.Process] = {}
        for agent in agents:
            with contextlib.suppress(psutil.Error):
                for child in agent.children(recursive=True):
                    everything[child.pid] = child
        for info in ranks:  # ranks not under a found torchrun still count
            with contextlib.suppress(psutil.Error):
                everything.setdefault(info.pid, psutil.Process(info.pid))
        # torchrun first: killed, it cannot restart the workers killed next
        self._targets = agents + [everything[pid] for pid in sorted(everything)]


class KillRdzvHost(_KillFault):
    """Kill the torchrun that listens on the job's rendezvous port, when it is on this node."""

    kind = "kill_rdzv_host"
    spec_type = KillRdzvHostSpec

    def prepare(self, ctx: FaultContext) -> None:
        assert isinstance(self.spec, KillRdzvHostSpec)
        for agent in _single_job(ctx, self.spec.job):
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


class KillAgent(Fault):
    """The agent signals itself after answering (a timer thread)."""

    kind = "kill_agent"
    spec_type = KillAgentSpec

    def prepare(self, ctx: FaultContext) -> None:
        return None

    def inject(self, ctx: FaultContext) -> Injection:
        assert isinstance(self.spec, KillAgentSpec)
        pid, number = os.getpid(), getattr(signal, self.spec.signal)
        timer = threading.Timer(self.spec.delay_seconds, os.kill, args=(pid, number))
        timer.daemon = True
        timer.start()
        return Injection(target_pid=pid, details={"signal": self.spec.signal})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Nothing to undo: the agent is (or was) dead; a supervisor restarts it."""
        return None


class FreezeRanks(Fault):
    """SIGSTOP ranks (and their descendants; optionally torchrun); SIGCONT on revert."""

    kind = "freeze_ranks"
    spec_type = FreezeRanksSpec

    def __init__(self, spec: FaultSpec) -> None:
        super().__init__(spec)
        self._targets: list[psutil.Process] = []

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.spec
        assert isinstance(spec, FreezeRanksSpec)
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
        agents = torchruns(ranks) if spec.include_torchrun else []
        self._targets = agents + [targets[pid] for pid in sorted(targets)]

    def inject(self, ctx: FaultContext) -> Injection:
        try:
            sent = _signal_all(self._targets, "SIGSTOP")
        except FaultError:
            for process in self._targets:  # nothing half-applied: continue what was stopped
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signal.SIGCONT)
            raise
        stopped = [p for ref in sent if (p := same_process(ref)) is not None]
        # the signal is asynchronous: answer once the processes are seen stopped
        wait_until(lambda: all(_stopped(p) for p in stopped), CONTINUE_TIMEOUT_S)
        return Injection(target_pid=int(sent[-1][0]), details={"processes": sent})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """SIGCONT every recorded process still alive; then check none is left stopped.

        Without an injection (crash between ledger and signal) nothing was recorded as
        stopped, so there is nothing to continue.

        Raises:
            FaultError: a process is still stopped after SIGCONT.
        """
        if injection is None:
            return
        alive = [p for ref in injection.details.get("processes", []) if (p := same_process(ref))]
        for process in alive:
            try:
                process.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                continue
            except psutil.Error as exc:
                raise FaultError(f"cannot SIGCONT pid {process.pid}: {exc}") from exc

        def stopped() -> list[int]:
            return [p.pid for p in alive if _stopped(p)]

        if not wait_until(lambda: not stopped(), CONTINUE_TIMEOUT_S):
            raise FaultError(f"processes still stopped after SIGCONT: {stopped()}")


def _stopped(process: psutil.Process) -> bool:
    try:
        return bool(process.status() == psutil.STATUS_STOPPED)
    except psutil.Error:
        return True  # gone: nothing left to wait for


__all__ = [
    "FreezeRanks",
    "FreezeRanksSpec",
    "KillAgent",
    "KillAgentSpec",
    "KillNodeProcesses",
    "KillNodeProcessesSpec",
    "KillRdzvHost",
    "KillRdzvHostSpec",
    "KillTorchrun",
    "KillTorchrunSpec",
]
