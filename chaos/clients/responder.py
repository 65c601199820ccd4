"""Client for the responder's read API (``GET /v1/notifications``, ``/v1/incidents``, ``/v1/actions``).

The JSON is the responder's records (docs/ARCHITECTURE.md, "Alerts and
responder"; all times Unix seconds). A body may be a list or an object holding
the list under the endpoint's name; fields added later are ignored.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from pydantic import BaseModel, ConfigDict, ValidationError

from stormwatch.chaos.clients._http import DEFAULT_TIMEOUT_S, request_json
from stormwatch.chaos.errors import ServiceError


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Notification(_Record):
    """One webhook notification the responder accepted (``status`` firing or resolved)."""

    id: int
    received_at: float
    group_key: str = ""
    status: str
    alerts: int = 0
    new_alerts: int = 0


class IncidentMember(_Record):
    """One alert of an incident, with the times Prometheus gave it (Unix s)."""

    alertname: str
    status: str = "firing"
    labels: dict[str, str] = {}
    starts_at: float | None = None
    ends_at: float | None = None


class Incident(_Record):
    """One alert occurrence: opened by its first firing notification, closed by its resolution."""

    id: int
    alertname: str
    status: str
    labels: dict[str, str] = {}
    group_key: str = ""
    starts_at: float | None = None
    ends_at: float | None = None
    opened_at: float
    closed_at: float | None = None
    members: list[IncidentMember] = []


class Action(_Record):
    """One automatic action the responder took for an incident."""

    id: int
    incident_id: int
    kind: str
    status: str
    created_at: float | None = None
    finished_at: float | None = None
    detail: str = ""


class ResponderClient:
    """The responder at ``base_url`` (``http://127.0.0.1:19095``).

    Args:
        session: aiohttp session (owned by the caller).
        base_url: server root.
        token_file: Bearer token file, sent when given (the read API may not need it).
        timeout: per-request timeout, seconds.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        token_file: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._session = session
        self.base_url = base_url.rstrip("/")
        self._token_file = token_file
        self._timeout = timeout

    async def notifications(self) -> list[Notification]:
        """Raises ServiceError when the responder is unreachable or answers nonsense."""
        return _parse(Notification, "notifications", await self._list("notifications"))

    async def incidents(self) -> list[Incident]:
        """Raises ServiceError when the responder is unreachable or answers nonsense."""
        return _parse(Incident, "incidents", await self._list("incidents"))

    async def actions(self) -> list[Action]:
        """Raises ServiceError when the responder is unreachable or answers nonsense."""
        return _parse(Action, "actions", await self._list("actions"))

    async def _list(self, name: str) -> list[Any]:
        headers = {}
        if self._token_file is not None:
            with contextlib.suppress(OSError):
                headers["Authorization"] = "Bearer " + self._token_file.read_text().strip()
        _, body = await request_json(
            self._session,
            "GET",
            f"{self.base_url}/v1/{name}",
            what="responder",
            timeout=self._timeout,
            headers=headers,
            params={"limit": "1000"},
        )
        items = body.get(name) if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise ServiceError(f"responder /v1/{name}: expected a list, got {type(items).__name__}")
        return items


_R = TypeVar("_R", bound=_Record)


def _parse(model: type[_R], name: str, items: list[Any]) -> list[_R]:
    try:
        return [model.model_validate(item) for item in items]
    except ValidationError as exc:
        raise ServiceError(f"responder /v1/{name}: unexpected record: {exc}") from exc


__all__ = ["Action", "Incident", "Notification", "ResponderClient"]
