"""Fault kinds: each binds a spec from the experiment to a target and can ``inject()``/``revert()``.

The catalogue (models in :mod:`.specs`, documented in docs/faults.md):

* ``kill_rank`` (:class:`KillRank`): agent-side; the agent signals the worker and
  drops its record at the TTL.
* ``freeze_rank`` (:class:`FreezeRank`): controller-side SIGSTOP/SIGCONT; a
  detached reaper (:mod:`stormwatch.chaos.ledger.reaper`) reverts it at the TTL.
* every other kind (:class:`AgentSideFault`): sent to the node agent(s) over the
  fault API, applied and reverted at the TTL by the agents themselves;
  ``kill_agent`` excepted: a dead agent reverts nothing, so a reaper does it at
  the TTL, and its revert starts the agent again through the platform (the lab
  restarts the service; a DaemonSet or systemd unit is waited for).

:func:`bind_fault` builds the right object from a ledger entry's parts, so a
fresh process holding only the ledger can revert any fault.
"""

from __future__ import annotations

from collections.abc import Callable

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.faults.agent_side import AgentSideFault, plan_requests
from stormwatch.chaos.faults.base import ActiveFault, AgentRequest, FaultTarget, InjectionResult
from stormwatch.chaos.faults.freeze_rank import FreezeRank, find_rank_process
from stormwatch.chaos.faults.kill_rank import KillRank
from stormwatch.chaos.faults.specs import Fault, FreezeRankFault, KillAgentFault, KillRankFault


def bind_fault(
    *,
    fault_id: str,
    spec: Fault,
    target: FaultTarget,
    agents: AgentClient,
    expires_at: float | None = None,
    injected_at: float | None = None,
    restore_agent: Callable[[str], str | None] | None = None,
) -> ActiveFault:
    """The fault object for ``spec`` at ``target``.

    ``injected_at`` and ``restore_agent`` matter to ``kill_agent`` only (see
    :class:`AgentSideFault`).

    Raises:
        FaultError: the target lacks what this kind needs (agent URL, pid, requests...).
    """
    if isinstance(spec, KillRankFault):
        return KillRank(
            fault_id=fault_id, spec=spec, target=target, agents=agents, expires_at=expires_at
        )
    if isinstance(spec, FreezeRankFault):
        return FreezeRank(fault_id=fault_id, spec=spec, target=target)
    return AgentSideFault(
        fault_id=fault_id,
        spec=spec,
        target=target,
        agents=agents,
        expires_at=expires_at,
        injected_at=injected_at,
        restore_agent=restore_agent,
    )


def reverts_itself(spec: Fault) -> bool:
    """Whether something outside the controller (the agent) reverts this kind at its TTL
    (not ``freeze_rank``, controller-side, nor ``kill_agent``: the agent is dead)."""
    return not isinstance(spec, FreezeRankFault | KillAgentFault)


__all__ = [
    "ActiveFault",
    "AgentRequest",
    "AgentSideFault",
    "FaultTarget",
    "FreezeRank",
    "InjectionResult",
    "KillRank",
    "bind_fault",
    "find_rank_process",
    "plan_requests",
    "reverts_itself",
]
