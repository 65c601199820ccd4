"""Shared request helper: one place that turns aiohttp failures into ServiceError."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from stormwatch.chaos.errors import ServiceError

#: Default per-request timeout (seconds). Every service here is on this host or
#: one bridge hop away; 5 s is generous and keeps a dead service from stalling a probe.
DEFAULT_TIMEOUT_S = 5.0


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    ok: tuple[int, ...] = (200,),
    **kwargs: Any,
) -> tuple[int, Any]:
    """Send a request; returns ``(status, parsed JSON or None)`` for statuses in ``ok``.

    Raises:
        ServiceError: unreachable, timed out, a status outside ``ok``, or a body that is not JSON.
    """
    try:
        async with session.request(
            method, url, timeout=aiohttp.ClientTimeout(total=timeout), **kwargs
        ) as response:
            body = await response.read()
            if response.status not in ok:
                snippet = body[:200].decode("utf-8", "replace").strip()
                raise ServiceError(
                    f"{what}: {method} {url} answered HTTP {response.status}: {snippet}"
                )
            if not body.strip():
                return response.status, None
            try:
                return response.status, json.loads(body)
            except ValueError as exc:
                raise ServiceError(f"{what}: {method} {url} did not return JSON") from exc
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise ServiceError(f"{what}: {method} {url} failed: {exc or type(exc).__name__}") from exc
