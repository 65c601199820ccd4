"""A small async client for the Prometheus HTTP API (instant queries only).

Actions depend on the :class:`PrometheusAPI` protocol, not on this class, so a
test can serve Prometheus-shaped JSON from its own loopback server or pass any
object with the same ``query`` method.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, ConfigDict, JsonValue, TypeAdapter, ValidationError

from stormwatch.alerts.errors import PrometheusError
from stormwatch.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector: labels and a float value."""

    labels: Mapping[str, str]
    value: float


class PrometheusAPI(Protocol):
    """What actions need from Prometheus: instant queries."""

    async def query(self, promql: str, *, at: float | None = None) -> list[Sample]:
        """Evaluate ``promql`` at Unix time ``at`` (default: now) as an instant vector.

        Raises:
            PrometheusError: Prometheus could not be reached or rejected the query.
        """
        ...


class _VectorElement(BaseModel):
    model_config = ConfigDict(extra="ignore")
    metric: dict[str, str]
    value: tuple[float, str]


class _Data(BaseModel):
    model_config = ConfigDict(extra="ignore")
    resultType: str
    result: JsonValue


_VECTOR = TypeAdapter(list[_VectorElement])


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")
    status: str
    data: _Data | None = None
    errorType: str | None = None
    error: str | None = None


def promql_string(value: str) -> str:
    """Quote ``value`` as a PromQL string literal (for label matchers)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class PrometheusClient:
    """:class:`PrometheusAPI` over HTTP (``GET /api/v1/query``) with aiohttp.

    Args:
        base_url: e.g. ``http://127.0.0.1:19090``.
        timeout_s: per-request timeout in seconds (default 5 s: a local
            Prometheus answers these small queries in milliseconds).

    Raises:
        ConfigError: ``base_url`` is not an http(s) URL.

    Use as ``async with PrometheusClient(url) as prom: ...`` or call :meth:`aclose`.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 5.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"prometheus_url: {base_url!r} is not an http(s) URL, e.g. http://127.0.0.1:19090"
            )
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s: must be > 0 (got {timeout_s!r})")
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> PrometheusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP session (idempotent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def query(self, promql: str, *, at: float | None = None) -> list[Sample]:
        """See :meth:`PrometheusAPI.query`; a non-vector result raises PrometheusError."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        url = f"{self.base_url}/api/v1/query"
        try:
            async with self._session.get(url, params=params) as resp:
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise PrometheusError(f"{url}: {type(exc).__name__}: {exc}") from exc
        try:
            parsed = _Response.model_validate_json(body)
        except ValidationError as exc:
            raise PrometheusError(f"{url}: HTTP {status}, not a Prometheus API answer") from exc
        if parsed.status != "success" or parsed.data is None:
            raise PrometheusError(
                f"{url}: HTTP {status}: {parsed.errorType or 'error'}: {parsed.error or 'no data'}"
                f" (query {promql!r})"
            )
        if parsed.data.resultType != "vector":
            raise PrometheusError(f"{url}: expected a vector, got {parsed.data.resultType!r}")
        try:
            vector = _VECTOR.validate_python(parsed.data.result)
        except ValidationError as exc:
            raise PrometheusError(f"{url}: malformed vector in the answer") from exc
        return [Sample(labels=e.metric, value=float(e.value[1])) for e in vector]


__all__ = ["PrometheusAPI", "PrometheusClient", "Sample", "promql_string"]
