"""Client of the responder's read API (``/v1/incidents``, ``/v1/actions``, ...).

Async :class:`ResponderClient` for code that runs an event loop, and
:func:`fetch_incidents` / :func:`fetch_actions` for plain synchronous callers
(the CLI, the lab's post-mortem).
"""

from __future__ import annotations

import asyncio
from typing import TypeVar
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, TypeAdapter, ValidationError

from stormwatch.alerts.errors import ResponderClientError
from stormwatch.alerts.responder.records import ActionRecord, IncidentRecord, NotificationRecord
from stormwatch.errors import ConfigError

R = TypeVar("R", bound=BaseModel)


class ResponderClient:
    """Reads the responder's state over HTTP with a Bearer token.

    Args:
        base_url: e.g. ``http://127.0.0.1:19095``.
        token: the responder's Bearer token.
        timeout_s: per-request timeout (default 10 s).

    Raises:
        ConfigError: ``base_url`` is not an http(s) URL.
    """

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 10.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"url: {base_url!r} is not an http(s) URL, e.g. http://127.0.0.1:19095"
            )
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def notifications(self, *, limit: int = 1000) -> list[NotificationRecord]:
        """``GET /v1/notifications``: the latest ``limit``, oldest first."""
        return await self._list("notifications", NotificationRecord, limit)

    async def incidents(self, *, limit: int = 1000) -> list[IncidentRecord]:
        """``GET /v1/incidents``: the latest ``limit``, oldest first."""
        return await self._list("incidents", IncidentRecord, limit)

    async def actions(self, *, limit: int = 1000) -> list[ActionRecord]:
        """``GET /v1/actions``: the latest ``limit``, oldest first."""
        return await self._list("actions", ActionRecord, limit)

    async def approve(self, action_id: int, *, actor: str) -> None:
        """``POST /v1/actions/{id}/approve``.

        Raises:
            ResponderClientError: unreachable, or not approved (``status`` 404:
                no such action, 409: it is not waiting for approval).
        """
        url = f"{self.base_url}/v1/actions/{action_id}/approve"
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout, headers=self._headers) as session,
                session.post(url, json={"actor": actor}) as resp,
            ):
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise ResponderClientError(f"{url}: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            raise ResponderClientError(
                f"{url}: HTTP {status}: {body[:200].decode(errors='replace')}", status
            )

    async def _list(self, name: str, model: type[R], limit: int) -> list[R]:
        url = f"{self.base_url}/v1/{name}"
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout, headers=self._headers) as session,
                session.get(url, params={"limit": str(limit)}) as resp,
            ):
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise ResponderClientError(f"{url}: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            raise ResponderClientError(
                f"{url}: HTTP {status}: {body[:200].decode(errors='replace')}", status
            )
        try:
            return TypeAdapter(dict[str, list[model]]).validate_json(body)[name]  # type: ignore[valid-type]
        except (ValidationError, KeyError) as exc:
            raise ResponderClientError(f"{url}: unexpected answer: {exc}", status) from exc


def fetch_incidents(base_url: str, token: str) -> list[IncidentRecord]:
    """Synchronous :meth:`ResponderClient.incidents` (runs its own event loop)."""
    return asyncio.run(ResponderClient(base_url, token).incidents())


def fetch_actions(base_url: str, token: str) -> list[ActionRecord]:
    """Synchronous :meth:`ResponderClient.actions` (runs its own event loop)."""
    return asyncio.run(ResponderClient(base_url, token).actions())


__all__ = ["ResponderClient", "fetch_actions", "fetch_incidents"]
