"""Client for a node agent: ``/healthz``, ``/v1/ranks`` and the authenticated fault API.

The agent serves these on two listeners: ``healthy`` and ``ranks`` take the base URL
of its read-only listener (``AgentEndpoint.url``, ``--listen``), the fault calls
(``inject``, ``forget``, ``revert_fault``) the base URL of its fault API listener
(``AgentEndpoint.fault_api``, ``--fault-api-listen``). A fault call sent to the
read-only listener gets a plain 404 and raises :class:`ServiceError` ("did not return JSON").

Contract (docs/ARCHITECTURE.md, "Agent"): ``POST /v1/faults`` with a kind's request
body (:mod:`stormwatch.faults`, e.g. ``{"id", "kind", "rank", "signal", "ttl_seconds"}``)
and a Bearer token -> 201 and the agent's record of the fault
(:class:`~stormwatch.agent.faults.ledger.FaultRecord`, the model the agent's ledger
writes: ``id``, ``kind``, ``state``, ``applied_at``, ``expires_at``, ``target_pid`` ...);
404 when the rank is not on that node; 401 without a valid token; the same id twice
has one effect, so a retried POST is safe. ``DELETE /v1/faults/{id}`` reverts (or
forgets) a fault and answers its record.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, ValidationError

from stormwatch.agent.faults.ledger import FaultRecord
from stormwatch.chaos.errors import FaultError, RankNotFound, ServiceError
from stormwatch.clients.http import request_json as _request_json

#: Default per-request timeout (seconds). Every agent is on this host or one bridge hop
#: away; 5 s is generous and keeps a dead agent from stalling a probe.
DEFAULT_TIMEOUT_S = 5.0


def _service_error(message: str, status: int | None) -> ServiceError:
    return ServiceError(message)


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    what: str = "agent",
    timeout: float = DEFAULT_TIMEOUT_S,
    ok: tuple[int, ...] = (200,),
    **kwargs: Any,
) -> tuple[int, Any]:
    """One request to an agent through the shared HTTP plumbing
    (:func:`stormwatch.clients.http.request_json`); returns ``(status, parsed JSON or None)``.

    Raises:
        ServiceError: unreachable, timed out, a status outside ``ok``, or a body that is not
            JSON.
    """
    return await _request_json(
        session, method, url, what=what, error=_service_error, timeout=timeout, ok=ok, **kwargs
    )


class AgentRank(BaseModel):
    """A rank an agent has seen on its node (unknown extra fields are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    job: str
    rank: int
    local_rank: int | None = None
    pid: int | None = None
    alive: bool = True
    last_step: float | None = None


class AgentClient:
    """Talks to agents by base URL (``http://10.213.0.10:9400`` read-only,
    ``http://10.213.0.10:9401`` fault API in the lab).

    Args:
        session: the aiohttp session to use (owned by the caller).
        timeout: per-request timeout in seconds.
    """

    def __init__(self, session: aiohttp.ClientSession, *, timeout: float = DEFAULT_TIMEOUT_S):
        self._session = session
        self._timeout = timeout

    async def healthy(self, base_url: str) -> bool:
        """Whether ``GET /healthz`` answers 200 (never raises)."""
        try:
            await request_json(
                self._session, "GET", f"{base_url}/healthz", what="agent", timeout=self._timeout
            )
        except ServiceError:
            return False
        return True

    async def ranks(self, base_url: str) -> list[AgentRank]:
        """``GET /v1/ranks``: the ranks on that node (a JSON list, or ``{"ranks": [...]}``).

        Raises:
            ServiceError: the agent is unreachable or answered nonsense.
        """
        _, body = await request_json(
            self._session, "GET", f"{base_url}/v1/ranks", what="agent", timeout=self._timeout
        )
        items: Any = body.get("ranks", []) if isinstance(body, dict) else body
        try:
            return [AgentRank.model_validate(item) for item in items or []]
        except (ValidationError, TypeError) as exc:
            raise ServiceError(f"agent {base_url}: unexpected /v1/ranks answer: {exc}") from exc

    async def inject(self, base_url: str, token: str, body: dict[str, Any]) -> FaultRecord:
        """``POST /v1/faults``; the agent's record of the fault.

        Raises:
            RankNotFound: 404, the rank is not on this node (nothing happened).
            FaultError: 401/403, the token was refused.
            ServiceError: the agent is unreachable or failed.
        """
        status, answer = await self._fault_api(
            "POST", base_url, "/v1/faults", token, ok=(200, 201, 404), json=body
        )
        if status == 404:
            raise RankNotFound(f"agent {base_url}: rank {body.get('rank')} is not on this node")
        return _record(base_url, answer)

    async def forget(self, base_url: str, token: str, fault_id: str) -> bool:
        """``DELETE /v1/faults/{id}``; ``False`` when the agent no longer knows it (404).

        Raises:
            FaultError: the token was rejected.
            ServiceError: the agent is unreachable or failed.
        """
        status, _ = await self._fault_api(
            "DELETE", base_url, f"/v1/faults/{fault_id}", token, ok=(200, 202, 204, 404)
        )
        return status != 404

    async def revert_fault(self, base_url: str, token: str, fault_id: str) -> FaultRecord | None:
        """``DELETE /v1/faults/{id}``: revert now; the agent's fault record, None when the agent
        does not know the id (404: never applied there, or its ledger is gone).

        Raises:
            FaultError: the token was refused, or the agent tried and failed to revert
                (HTTP 500; the message is the agent's, e.g. rules still present).
            ServiceError: the agent is unreachable or answered something else than a record.
        """
        status, answer = await self._fault_api(
            "DELETE", base_url, f"/v1/faults/{fault_id}", token, ok=(200, 404, 500)
        )
        error = answer.get("error") if isinstance(answer, dict) else None
        if status == 500:
            raise FaultError(f"agent {base_url} could not revert fault {fault_id}: {error}")
        if status == 404:
            return None
        return _record(base_url, answer)

    async def faults(self, base_url: str, token: str) -> list[FaultRecord]:
        """``GET /v1/faults``: every fault in the agent's ledger.

        Raises:
            FaultError: the token was refused.
            ServiceError: the agent is unreachable or answered nonsense.
        """
        _, answer = await self._fault_api("GET", base_url, "/v1/faults", token, ok=(200,))
        items = answer.get("faults") if isinstance(answer, dict) else None
        if not isinstance(items, list):
            raise ServiceError(f"agent {base_url}: unexpected /v1/faults answer: {answer!r:.200}")
        return [_record(base_url, item) for item in items]

    async def _fault_api(
        self,
        method: str,
        base_url: str,
        path: str,
        token: str,
        *,
        ok: tuple[int, ...],
        **kwargs: Any,
    ) -> tuple[int, Any]:
        """One request to ``path`` of the fault API with the Bearer ``token``: ``(status, JSON body)``
        for a status in ``ok``.

        Raises:
            FaultError: 401/403, the token was refused.
            ServiceError: the agent is unreachable, or answered a status not in ``ok``.
        """
        status, answer = await request_json(
            self._session,
            method,
            base_url + path,
            what="agent",
            timeout=self._timeout,
            ok=(*ok, 401, 403),
            headers=_auth(token),
            **kwargs,
        )
        if status in (401, 403):
            raise FaultError(f"agent {base_url} rejected the Bearer token (HTTP {status})")
        return status, answer


def _record(base_url: str, answer: Any) -> FaultRecord:
    try:
        return FaultRecord.model_validate(answer)
    except ValidationError as exc:
        raise ServiceError(f"agent {base_url}: unexpected fault answer: {exc}") from exc


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


__all__ = ["DEFAULT_TIMEOUT_S", "AgentClient", "AgentRank", "request_json"]
