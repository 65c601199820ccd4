"""A small client for the Prometheus HTTP API (``/api/v1``).

:class:`PrometheusAPI` is the seam other components depend on (steady-state
probes, post-mortems, tests); :class:`PrometheusClient` implements it
synchronously and :class:`AsyncPrometheusClient` asynchronously, both with
aiohttp. Point either at any Prometheus (the lab's is ``LabState.prometheus_url``).

All times are Unix seconds (float); values are floats (``NaN``/``±Inf`` kept).

Raises:
    PrometheusAPIError: unreachable server, HTTP error, or ``status: error``
        (the message carries Prometheus' ``errorType`` and ``error``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar

import aiohttp

from stormwatch.lab.errors import PrometheusAPIError

T = TypeVar("T")

#: Seconds one HTTP request may take (queries over a lab's few series take milliseconds).
DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Sample:
    """One instant-vector element (or a scalar, with no labels).

    Attributes:
        labels: the series' labels, ``__name__`` included when the result has one.
        value: the sample value.
        timestamp: evaluation time, Unix seconds.
    """

    labels: Mapping[str, str]
    value: float
    timestamp: float

    @property
    def name(self) -> str | None:
        """The metric name, when the result kept it."""
        return self.labels.get("__name__")


@dataclass(frozen=True)
class Series:
    """One range-vector series: ``points`` are ``(timestamp, value)`` in time order."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Alert:
    """An alert Prometheus is evaluating (``/api/v1/alerts``).

    Attributes:
        name: the ``alertname`` label.
        state: ``pending`` or ``firing``.
        active_at: when it became pending, Unix seconds (``None`` when absent).
        value: the rule expression's value when last evaluated.
    """

    name: str
    state: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    active_at: float | None = None
    value: float | None = None


@dataclass(frozen=True)
class Target:
    """An active scrape target (``/api/v1/targets``); ``health`` is ``up``, ``down`` or ``unknown``."""

    scrape_url: str
    labels: Mapping[str, str]
    health: str
    last_error: str
    last_scrape: float | None


class PrometheusAPI(Protocol):
    """The queries stormwatch components make against Prometheus."""

    def query(self, expr: str, *, at: float | None = None) -> list[Sample]:
        """Evaluate an instant query (at ``at``, default now)."""
        ...

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> list[Series]:
        """Evaluate a range query from ``start`` to ``end`` every ``step`` seconds."""
        ...

    def alerts(self) -> list[Alert]:
        """Pending and firing alerts."""
        ...


def _timestamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _samples(data: Mapping[str, Any], expr: str) -> list[Sample]:
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "vector":
        return [
            Sample(dict(item["metric"]), float(item["value"][1]), float(item["value"][0]))
            for item in result or []
        ]
    if kind in ("scalar", "string") and result is not None:
        ts, value = result
        return [Sample({}, float(value) if kind == "scalar" else float("nan"), float(ts))]
    raise PrometheusAPIError(
        f"query {expr!r} returned a {kind} (use query_range, or wrap a range selector in "
        "e.g. last_over_time())"
    )


def _series(data: Mapping[str, Any]) -> list[Series]:
    return [
        Series(dict(item["metric"]), tuple((float(t), float(v)) for t, v in item["values"]))
        for item in data.get("result") or []
    ]


def _alerts(data: Mapping[str, Any]) -> list[Alert]:
    found = []
    for item in data.get("alerts") or []:
        labels = dict(item.get("labels") or {})
        value = item.get("value")
        found.append(
            Alert(
                name=labels.get("alertname", ""),
                state=item.get("state", ""),
                labels=labels,
                annotations=dict(item.get("annotations") or {}),
                active_at=_timestamp(item.get("activeAt")),
                value=float(value) if value is not None else None,
            )
        )
    return found


def _targets(data: Mapping[str, Any]) -> list[Target]:
    return [
        Target(
            scrape_url=item.get("scrapeUrl", ""),
            labels=dict(item.get("labels") or {}),
            health=item.get("health", "unknown"),
            last_error=item.get("lastError", ""),
            last_scrape=_timestamp(item.get("lastScrape")),
        )
        for item in data.get("activeTargets") or []
    ]


class AsyncPrometheusClient:
    """:class:`PrometheusAPI` with coroutines, for callers inside an event loop.

    Args:
        base_url: e.g. ``http://127.0.0.1:19090`` (no ``/api/v1``).
        timeout: seconds per request.
        session: an aiohttp session to reuse (the caller closes it); by default each
            call opens and closes its own.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session = session

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        url = f"{self.base_url}{path}"
        try:
            if self._session is not None:
                return await self._fetch(self._session, url, params)
            async with aiohttp.ClientSession(timeout=self._timeout) as session:
                return await self._fetch(session, url, params)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise PrometheusAPIError(f"GET {url}: {type(exc).__name__}: {exc}") from exc

    async def _fetch(
        self, session: aiohttp.ClientSession, url: str, params: Mapping[str, str] | None
    ) -> Any:
        async with session.get(url, params=params, timeout=self._timeout) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = None
            if not isinstance(body, dict):
                raise PrometheusAPIError(f"GET {url}: HTTP {resp.status}, not a Prometheus answer")
            if body.get("status") != "success":
                raise PrometheusAPIError(
                    f"GET {url}: HTTP {resp.status} {body.get('errorType', 'error')}: "
                    f"{body.get('error', 'no detail')}"
                )
            return body.get("data") or {}

    async def query(self, expr: str, *, at: float | None = None) -> list[Sample]:
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(float(at))
        return _samples(await self._get("/api/v1/query", params), expr)

    async def query_range(
        self, expr: str, *, start: float, end: float, step: float
    ) -> list[Series]:
        params = {"query": expr, "start": repr(start), "end": repr(end), "step": repr(step)}
        return _series(await self._get("/api/v1/query_range", params))

    async def alerts(self) -> list[Alert]:
        return _alerts(await self._get("/api/v1/alerts"))

    async def targets(self) -> list[Target]:
        """Active scrape targets and their health."""
        return _targets(await self._get("/api/v1/targets", {"state": "active"}))


def _run_sync(factory: Callable[[], Awaitable[T]]) -> T:
    async def runner() -> T:
        return await factory()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(runner())
    # Called from inside an event loop: run on a private loop in a worker thread.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, runner()).result()


class PrometheusClient:
    """Blocking :class:`PrometheusAPI` (each call runs its request on a short-lived event loop).

    Args:
        base_url: e.g. ``http://127.0.0.1:19090``.
        timeout: seconds per request.
    """

    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout

    def _client(self) -> AsyncPrometheusClient:
        return AsyncPrometheusClient(self.base_url, timeout=self._timeout)

    def query(self, expr: str, *, at: float | None = None) -> list[Sample]:
        return _run_sync(lambda: self._client().query(expr, at=at))

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> list[Series]:
        return _run_sync(lambda: self._client().query_range(expr, start=start, end=end, step=step))

    def alerts(self) -> list[Alert]:
        return _run_sync(lambda: self._client().alerts())

    def targets(self) -> list[Target]:
        """Active scrape targets and their health."""
        return _run_sync(lambda: self._client().targets())


__all__ = [
    "DEFAULT_TIMEOUT",
    "Alert",
    "AsyncPrometheusClient",
    "PrometheusAPI",
    "PrometheusClient",
    "Sample",
    "Series",
    "Target",
]
