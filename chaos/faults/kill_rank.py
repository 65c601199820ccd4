"""``kill_rank``: the agent on the rank's node signals the rank's worker (SIGKILL or SIGTERM).

The kill cannot be undone (torchrun restarts the workers); "revert" makes the
agent forget the fault record (``DELETE /v1/faults/{id}``), which the agent
also does by itself at ``expires_at``.
"""

from __future__ import annotations

import time
from pathlib import Path

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import FaultError, ServiceError
from stormwatch.chaos.faults.base import FaultTarget, InjectionResult
from stormwatch.chaos.faults.specs import KillRankFault

#: Agent-side faults revert themselves at their TTL; no controller-side reaper needed.
REVERTS_ITSELF = True


class KillRank:
    """A ``kill_rank`` fault bound to its id and the node holding the rank.

    Args:
        fault_id: ledger id, also the agent-side id (the same id twice = one kill).
        spec: the fault from the experiment.
        target: must name ``agent_url`` and ``token_file``.
        agents: HTTP client.
        expires_at: the ledger's expiry (Unix s); lets ``revert`` succeed when the agent
            is unreachable but has certainly dropped the fault already.
    """

    reverts_itself = REVERTS_ITSELF

    def __init__(
        self,
        *,
        fault_id: str,
        spec: KillRankFault,
        target: FaultTarget,
        agents: AgentClient,
        expires_at: float | None = None,
    ) -> None:
        if target.agent_url is None or target.token_file is None:
            raise FaultError(f"fault {fault_id}: kill_rank needs the agent URL and token file")
        self.fault_id = fault_id
        self.spec = spec
        self.target = target
        self._agents = agents
        self._expires_at = expires_at

    async def inject(self) -> InjectionResult:
        """Ask the agent to signal the rank.

        Raises:
            FaultError: the rank is not on that node (404), the token was refused, or the
                agent could not be reached.
        """
        assert self.target.agent_url is not None
        body = {
            "id": self.fault_id,
            "kind": "kill_rank",
            "rank": self.spec.rank,
            "job": self.target.job,
            "signal": self.spec.signal,
            "ttl_seconds": self.spec.ttl_seconds,
        }
        try:
            answer = await self._agents.inject(self.target.agent_url, self._token(), body)
        except ServiceError as exc:
            raise FaultError(f"fault {self.fault_id}: {exc}") from exc
        pid = f" (pid {answer.target_pid})" if answer.target_pid else ""
        return InjectionResult(
            applied_at=answer.applied_at if answer.applied_at is not None else time.time(),
            expires_at=answer.expires_at,
            target_pid=answer.target_pid,
            detail=f"{self.spec.signal} to rank {self.spec.rank}{pid} on {self.target.node}",
        )

    async def revert(self) -> str:
        """Make the agent forget the fault (idempotent).

        Raises:
            FaultError: the agent is unreachable and the fault's TTL has not expired yet.
        """
        assert self.target.agent_url is not None
        try:
            known = await self._agents.forget(self.target.agent_url, self._token(), self.fault_id)
        except ServiceError as exc:
            if self._expires_at is not None and time.time() >= self._expires_at:
                return f"agent unreachable; its fault record expired at {self._expires_at:.0f}"
            raise FaultError(
                f"fault {self.fault_id}: cannot reach the agent to revert: {exc}"
            ) from exc
        if known:
            return f"agent {self.target.node} dropped the fault (the kill itself is final)"
        return f"agent {self.target.node} no longer holds the fault (already expired or reverted)"

    def _token(self) -> str:
        assert self.target.token_file is not None
        try:
            return Path(self.target.token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise FaultError(
                f"fault {self.fault_id}: cannot read the agent token {self.target.token_file}: "
                f"{exc.strerror}"
            ) from exc


__all__ = ["KillRank"]
