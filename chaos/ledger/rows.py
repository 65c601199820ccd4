"""Where a fault landed, as the ledger's ``target`` column holds it (part of :class:`LedgerEntry`).

A fault (an experiment's ``fault:`` mapping, :data:`stormwatch.faults.AnyExperimentFault`)
says *what*; a :class:`FaultTarget` says *where* (node and agent, or process). With
the fault id they are recorded in the ledger **before** the fault is sent, so that a
fresh process holding only the ledger entry can revert it
(:mod:`stormwatch.chaos.ledger.undo`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.chaos.errors import FaultError


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
        node: node that holds the rank (agent-side faults).
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

    def token(self, fault_id: str) -> str:
        """The agents' Bearer token, read from ``token_file`` now.

        Raises:
            FaultError: no token file, or it cannot be read (naming fault and file).
        """
        if self.token_file is None:
            raise FaultError(f"fault {fault_id}: its target has no agent token file")
        try:
            return Path(self.token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise FaultError(
                f"fault {fault_id}: cannot read the agent token {self.token_file}: {exc.strerror}"
            ) from exc


__all__ = ["AgentRequest", "FaultTarget"]
