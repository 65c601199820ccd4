"""The one client of the responder's HTTP API (``/v1/notifications``, ``/v1/incidents``,
``/v1/actions``, ``POST /v1/actions/{id}/approve``).

Answers are parsed into the responder's own records (:mod:`stormwatch.contracts.responder`),
so a field the responder adds or renames shows up here at once. Used by the ``stormwatch
alerts incidents`` / ``approve`` commands and by the chaos controller's post-mortem evidence.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TypeVar

import aiohttp
from pydantic import BaseModel, TypeAdapter, ValidationError

from stormwatch.clients.errors import ResponderClientError
from stormwatch.clients.http import HttpClient, HttpOptions
from stormwatch.contracts.responder import ActionRecord, IncidentRecord, NotificationRecord

R = TypeVar("R", bound=BaseModel)

#: Seconds per request (the responder answers from its SQLite database in milliseconds).
DEFAULT_TIMEOUT = 10.0
#: Records per list request (the responder's own default and the CLI's).
DEFAULT_LIMIT = 1000


class ResponderClient(HttpClient):
    """Reads the responder's state and approves actions over HTTP.

    Args:
        base_url: e.g. ``http://127.0.0.1:19095``.
        token: the responder's Bearer token.
        token_file: file holding the token, read on every request (instead of ``token``).
        timeout: seconds per request.
        options: TLS and further headers (the token arguments set its Bearer token).
        session: an aiohttp session to use (the caller closes it); without one the client
            holds a session inside ``async with`` and opens one per call otherwise.

    Raises:
        ConfigError: ``base_url`` is not an http(s) URL, ``timeout`` <= 0, or both
            ``token`` and ``token_file``.
    """

    what = "responder"
    url_field = "url"
    url_example = "http://127.0.0.1:19095"
    error = ResponderClientError

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        token_file: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        options: HttpOptions | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        base = options or HttpOptions()
        if token is not None or token_file is not None:
            base = dataclasses.replace(base, bearer_token=token, bearer_token_file=token_file)
        super().__init__(base_url, timeout=timeout, options=base, session=session)

    async def notifications(self, *, limit: int = DEFAULT_LIMIT) -> list[NotificationRecord]:
        """``GET /v1/notifications``: the latest ``limit``, oldest first.

        Raises:
            ResponderClientError: unreachable, an error status, or not a list of records.
        """
        return await self._list("notifications", NotificationRecord, limit)

    async def incidents(self, *, limit: int = DEFAULT_LIMIT) -> list[IncidentRecord]:
        """``GET /v1/incidents``: the latest ``limit``, oldest first (raises as above)."""
        return await self._list("incidents", IncidentRecord, limit)

    async def actions(self, *, limit: int = DEFAULT_LIMIT) -> list[ActionRecord]:
        """``GET /v1/actions``: the latest ``limit``, oldest first (raises as above)."""
        return await self._list("actions", ActionRecord, limit)

    async def approve(self, action_id: int, *, actor: str) -> None:
        """``POST /v1/actions/{id}/approve``.

        Raises:
            ResponderClientError: unreachable, or not approved (``status`` 404: no such
                action, 409: it is not waiting for approval).
        """
        await self._send("POST", f"/v1/actions/{action_id}/approve", json={"actor": actor})

    async def _list(self, name: str, model: type[R], limit: int) -> list[R]:
        status, body = await self._send("GET", f"/v1/{name}", params={"limit": str(limit)})
        try:
            return TypeAdapter(dict[str, list[model]]).validate_json(body)[name]  # type: ignore[valid-type]
        except (ValidationError, KeyError) as exc:
            raise ResponderClientError(
                f"responder: GET {self.base_url}/v1/{name}: unexpected answer: {exc}", status
            ) from exc


__all__ = ["DEFAULT_LIMIT", "DEFAULT_TIMEOUT", "ResponderClient"]
