"""A row of the controller's fault ledger (``<run-dir>/chaos/ledger.sqlite3``, table ``faults``).

Writer: the chaos controller's ledger (:class:`stormwatch.chaos.ledger.ledger.Ledger`),
which records a fault *before* it is sent (``pending``), marks it ``injected`` when the
target confirms and ``reverted`` once undone. Readers: ``chaos ledger``, revert and the
reaper, verification, and every experiment journal, which embeds the experiment's rows
at the end (:mod:`stormwatch.contracts.journal`), read across the chaos/alerts line by
incident post-mortems; so the row is declared here, in the shared home.

A fault (an experiment's ``fault:`` mapping, :data:`stormwatch.faults.AnyExperimentFault`)
says *what*; a :class:`FaultTarget` says *where* (node and agent, or process). With the
fault id they are recorded **before** the fault is sent, so that a fresh process holding
only the row can revert it (:mod:`stormwatch.chaos.ledger.undo`). Times are Unix seconds.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.faults import AnyExperimentFault

FaultState = Literal["pending", "injected", "reverted"]


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
    """Where a fault lands (the ledger's ``target`` column).

    Attributes:
        job: training job name (``STORMWATCH_JOB``).
        rank: global rank.
        node: node that holds the rank (agent-side faults).
        agent_url: that node's agent, e.g. ``http://10.213.0.10:9400``.
        token_file: file holding the agent's Bearer token (read at use, never stored here;
            :func:`stormwatch.chaos.ledger.tokens.agent_token`).
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


class LedgerEntry(BaseModel):
    """One fault in the ledger (a row of ``faults``). ``spec`` is the experiment's fault,
    ``target`` where it landed; ``expires_at`` the end of its TTL, when the agent or the
    reaper reverts it by itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    experiment_id: str
    kind: str
    spec: AnyExperimentFault
    target: FaultTarget
    state: FaultState
    recorded_at: float
    expires_at: float
    injected_at: float | None = None
    target_pid: int | None = None
    reverted_at: float | None = None
    revert_reason: str | None = None
    revert_detail: str | None = None
    controller_pid: int
    controller_started_at: float
    last_error: str | None = None

    @property
    def open(self) -> bool:
        """Not reverted yet (pending faults count: they may have taken effect)."""
        return self.state != "reverted"


__all__ = ["AgentRequest", "FaultState", "FaultTarget", "LedgerEntry"]
