"""What a fault is once it has a place: its target and the result of injecting it.

A fault spec (:data:`stormwatch.chaos.experiment.model.Fault`) says *what*; a
:class:`FaultTarget` says *where* (node and agent, or process); together with
the fault id they are recorded in the ledger **before** the fault is sent, so
that a fresh process holding only the ledger entry can revert it.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field


class AgentRequest(BaseModel):
    """One request sent to one node agent for a fault (a partition sends one per node).

    Attributes:
        node: the node.
        agent_url: its agent's fault API base URL.
        body: the ``POST /v1/faults`` body, ``id`` included (the agent-side fault id).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    agent_url: str
    body: dict[str, Any]


class FaultTarget(BaseModel):
    """Where a fault lands.

    Attributes:
        job: training job name (``STORMWATCH_JOB``).
        rank: global rank.
        node: lab node that holds the rank (agent-side faults).
        agent_url: that node's agent, e.g. ``http://10.213.0.10:9400``.
        token_file: file holding the agent's Bearer token (read at use, never stored here).
        pid: target process (controller-side faults).
        pid_create_time: the process's start time (``psutil``, Unix seconds), so a
            reused PID is never signalled by mistake.
        requests: what is sent to which agent (agent-side kinds other than ``kill_rank``);
            recorded before sending, so a revert knows every agent-side id.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str
    rank: int | None = Field(default=None, ge=0)
    node: str | None = None
    agent_url: str | None = None
    token_file: str | None = None
    pid: int | None = None
    pid_create_time: float | None = None
    requests: tuple[AgentRequest, ...] = ()


class InjectionResult(BaseModel):
    """What injecting did. Times are Unix seconds.

    Attributes:
        applied_at: when the fault took effect.
        expires_at: when it is reverted at the latest (TTL), by the agent or the reaper.
        target_pid: the process that was signalled, when known.
        detail: a short human description (``SIGKILL sent to pid 4242 on sw-node0``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    applied_at: float
    expires_at: float
    target_pid: int | None = None
    detail: str = ""


class ActiveFault(Protocol):
    """A fault bound to its id and target. ``revert()`` is idempotent and needs only the ledger entry.

    Raises (both methods):
        FaultError: the fault could not be applied / undone (the message says why).
    """

    fault_id: str
    target: FaultTarget

    async def inject(self) -> InjectionResult:
        """Apply the fault; the same ``fault_id`` twice has one effect."""
        ...

    async def revert(self) -> str:
        """Undo the fault (or confirm it is gone); returns what was done, for the journal."""
        ...


__all__ = ["ActiveFault", "AgentRequest", "FaultTarget", "InjectionResult"]
