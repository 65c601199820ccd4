"""Undo one fault from its ledger entry alone, by its kind's traits (idempotent).

* ``CONTROLLER`` placement (``freeze_rank``): SIGCONT of the recorded process, if it
  is still the same one (pid and start time: a reused pid is never signalled);
* ``RANK_AGENT`` placement (``kill_rank``): the agent forgets the fault (the kill
  itself is final); an unreachable agent is fine once the fault's TTL has passed;
* ``kills_agent`` (``kill_agent``): the agent must answer again (restarted through
  the platform when a ``restore_agent`` is given), then its record is closed;
* every other kind: ``DELETE`` every agent-side part and check each agent reports it
  reverted; an agent that answers that its revert failed (rules still present, a peer
  still unreachable) makes the revert fail loudly (FC-13) and the fault stays open.
  An agent that cannot be reached is retried for :data:`UNREACHABLE_RETRY_S`, except
  for a final kind (a kill: nothing is left to undo).

Applying faults is :mod:`stormwatch.chaos.execution.injection.placement`.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

import psutil

from stormwatch.agent.faults.ledger import FaultState
from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import FaultError, ServiceError
from stormwatch.chaos.ledger.tokens import agent_token
from stormwatch.contracts.fault_ledger import AgentRequest, FaultTarget
from stormwatch.errors import StormwatchError
from stormwatch.faults import ExperimentFault, Placement
from stormwatch.faults.kinds.orphans import describe_orphans
from stormwatch.faults.system import same_process, wait_continued

#: How long revert keeps trying an agent it cannot reach (a flapping link comes back), seconds.
UNREACHABLE_RETRY_S = 6.0
#: How long reverting a ``kill_agent`` waits for the agent to answer again, seconds (a
#: DaemonSet's first restart back-off is 10 s; the lab restarts it at once).
AGENT_BACK_TIMEOUT_S = 90.0
#: The agent kills itself this long after answering the inject (its ``delay_seconds``
#: default, 0.5 s, plus a margin): a revert probes it only after that.
KILL_AGENT_SETTLE_S = 1.5
#: Agent-side states of a part that is no longer in force.
_CLOSED = (FaultState.REVERTED, FaultState.FAILED)


async def undo_fault(
    *,
    fault_id: str,
    spec: ExperimentFault,
    target: FaultTarget,
    agents: AgentClient,
    expires_at: float | None = None,
    injected_at: float | None = None,
    restore_agent: Callable[[str], str | None] | None = None,
) -> str:
    """Undo ``spec`` at ``target`` (or confirm it is gone); returns what was done.

    Args:
        expires_at: the ledger's expiry (Unix s): a ``kill_rank`` whose agent is
            unreachable after it counts as closed.
        injected_at: when it was applied (Unix s; ``kill_agent`` waits for the kill to land
            before checking the agent).
        restore_agent: ``restore_agent(node)`` starts a dead agent again through the
            platform and says what it did (the lab restarts its service), or returns None
            when the platform itself is gone (a lab brought down); None: the platform's own
            supervisor (DaemonSet, systemd) is waited for.

    Raises:
        FaultError: it could not be undone (the message says why; the fault stays open).
    """
    placement = spec.traits.placement
    if placement is Placement.CONTROLLER:
        return await _sigcont(fault_id, spec, target)
    if placement is Placement.RANK_AGENT:
        return await _forget(fault_id, spec, target, agents, expires_at)
    if not target.requests or target.token_file is None:
        raise FaultError(f"fault {fault_id}: {spec.kind} needs agent requests and a token file")
    token = agent_token(target, fault_id)
    if spec.traits.kills_agent:
        if injected_at is not None:
            await asyncio.sleep(max(0.0, injected_at + KILL_AGENT_SETTLE_S - time.time()))
        done = [
            await _revive(fault_id, part, agents, token, restore_agent) for part in target.requests
        ]
    else:
        final = spec.traits.final
        done = [await _delete(fault_id, part, agents, token, final) for part in target.requests]
    return f"{spec.kind} reverted ({'; '.join(done)})"


async def _sigcont(fault_id: str, spec: ExperimentFault, target: FaultTarget) -> str:
    """SIGCONT the recorded process if it is still the same one (a gone process is fine),
    and wait up to :data:`~stormwatch.faults.system.SIGNAL_SETTLE_S` for it to run again.

    Raises:
        FaultError: the process exists but cannot be signalled, or is still stopped.
    """
    if target.pid is None or target.pid_create_time is None:
        raise FaultError(f"fault {fault_id}: {spec.kind} needs the target pid and start time")
    process = same_process((target.pid, target.pid_create_time))
    if process is None:
        return f"process {target.pid} is gone; nothing to continue"
    try:
        process.send_signal(signal.SIGCONT)
    except psutil.NoSuchProcess:
        return f"process {target.pid} is gone; nothing to continue"
    except psutil.Error as exc:
        raise FaultError(f"fault {fault_id}: SIGCONT {target.pid}: {exc}") from exc
    if await asyncio.to_thread(wait_continued, [process]):
        raise FaultError(f"fault {fault_id}: pid {target.pid} is still stopped after SIGCONT")
    return f"SIGCONT sent to pid {target.pid}"


async def _forget(
    fault_id: str,
    spec: ExperimentFault,
    target: FaultTarget,
    agents: AgentClient,
    expires_at: float | None,
) -> str:
    """Make the agent forget a final fault (idempotent).

    Raises:
        FaultError: the agent is unreachable and the fault's TTL has not expired yet.
    """
    if target.agent_url is None or target.token_file is None:
        raise FaultError(f"fault {fault_id}: {spec.kind} needs the agent URL and token file")
    try:
        known = await agents.forget(target.agent_url, agent_token(target, fault_id), fault_id)
    except ServiceError as exc:
        if expires_at is not None and time.time() >= expires_at:
            return f"agent unreachable; its fault record expired at {expires_at:.0f}"
        raise FaultError(f"fault {fault_id}: cannot reach the agent to revert: {exc}") from exc
    if known:
        return f"agent {target.node} dropped the fault (the kill itself is final)"
    return f"agent {target.node} no longer holds the fault (already expired or reverted)"


async def _delete(
    fault_id: str, part: AgentRequest, agents: AgentClient, token: str, final: bool
) -> str:
    """``DELETE`` one part; what its agent reports, as ``<node>: <state>``.

    Raises:
        FaultError: the agent still reports it in force, failed to revert it, or stays
            unreachable (a non-final fault; the agent still reverts it at its TTL).
    """
    deadline = time.monotonic() + UNREACHABLE_RETRY_S
    while True:
        try:
            record = await agents.revert_fault(part.agent_url, token, str(part.body["id"]))
            break
        except ServiceError as exc:
            if final:
                return f"{part.node}: closed"  # a kill (or a dead agent): nothing left to undo
            if time.monotonic() >= deadline:
                raise FaultError(
                    f"fault {fault_id}: cannot reach the agent of {part.node} to "
                    f"revert it: {exc} (the agent reverts it at its TTL)"
                ) from exc
            await asyncio.sleep(0.5)
    if record is None:
        return f"{part.node}: not held"
    if record.state in _CLOSED:  # with what a kill's revert had to stop (its orphans)
        reaped = describe_orphans(record.details) if "revert" in record.details else ""
        return f"{part.node}: {record.state.value}" + (f" ({reaped})" if reaped else "")
    raise FaultError(
        f"fault {fault_id}: agent {part.node} still reports it {record.state.value} "
        f"({record.error})"
    )


async def _revive(
    fault_id: str,
    part: AgentRequest,
    agents: AgentClient,
    token: str,
    restore_agent: Callable[[str], str | None] | None,
) -> str:
    """Revert of ``kill_agent`` on one node: the agent runs and answers again (restarted
    through the platform when ``restore_agent`` is given), then its record is closed.

    Raises:
        FaultError: the platform could not restart it, or it still does not answer after
            :data:`AGENT_BACK_TIMEOUT_S`.
    """
    agent_id = str(part.body["id"])
    try:
        await agents.revert_fault(part.agent_url, token, agent_id)
        return f"{part.node}: agent answering"
    except ServiceError:  # down, as kill_agent left it: restart it below
        pass
    how = "answering"
    if restore_agent is not None:
        try:
            restored = await asyncio.to_thread(restore_agent, part.node)
        except StormwatchError as exc:
            raise FaultError(
                f"fault {fault_id}: could not restart the agent of {part.node}: {exc}"
            ) from exc
        if restored is None:  # the whole platform (the lab) is down: nothing to restore
            return f"{part.node}: gone with the lab"
        how = restored
    deadline = time.monotonic() + AGENT_BACK_TIMEOUT_S
    while True:
        try:
            await agents.revert_fault(part.agent_url, token, agent_id)
            return f"{part.node}: agent {how}"
        except ServiceError as exc:
            if time.monotonic() >= deadline:
                raise FaultError(
                    f"fault {fault_id}: the agent of {part.node} still does not "
                    f"answer {AGENT_BACK_TIMEOUT_S:.0f} s into the revert ({exc}); start "
                    "it again (lab: `stormwatch lab up --run-dir RUN` restarts dead "
                    "agents; Kubernetes: the DaemonSet pod; Slurm: the agent's unit), "
                    "then `stormwatch chaos revert --all`"
                ) from exc
            await asyncio.sleep(0.5)


__all__ = [
    "AGENT_BACK_TIMEOUT_S",
    "KILL_AGENT_SETTLE_S",
    "UNREACHABLE_RETRY_S",
    "undo_fault",
]
