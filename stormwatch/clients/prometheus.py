"""The one client of the Prometheus HTTP API (``/api/v1``) in stormwatch.

:class:`AsyncPrometheusClient` makes the requests (aiohttp); :class:`PrometheusClient` is its
blocking face for callers without an event loop (the lab's health checks, the incident
post-mortem): each call runs the async client on a short-lived loop. Components depend on
the :class:`AsyncPrometheusAPI` / :class:`PrometheusAPI` protocols (steady-state probes,
``confirm_restart``, post-mortems), so a test can pass any object with the same methods.

Queries: :meth:`~AsyncPrometheusClient.query` (instant), ``query_range``, ``alerts``
(pending and firing), ``targets`` (active scrape targets), ``label_values``. TLS, basic
auth, a Bearer token and extra headers come from :class:`~stormwatch.clients.http.HttpOptions`.

All times are Unix seconds (float); values are floats (``NaN``/``±Inf`` kept).

Raises:
    PrometheusAPIError: unreachable server, HTTP error, ``status: error`` (the message
        carries Prometheus' ``errorType`` and ``error``) or an answer of another shape.
    ConfigError: on construction, a base URL that is not http(s) or a timeout <= 0.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar

import aiohttp

from stormwatch.clients.errors import PrometheusAPIError
from stormwatch.clients.http import HttpClient, HttpOptions

T = TypeVar("T")

#: Seconds one HTTP request may take (queries over a lab's few series take milliseconds;
#: 10 s leaves room for a loaded CI machine).
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
    """The blocking queries stormwatch components make against Prometheus."""

    def query(self, expr: str, *, at: float | None = None) -> list[Sample]:
        """Evaluate an instant query (at ``at``, default now)."""
        ...

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> list[Series]:
        """Evaluate a range query from ``start`` to ``end`` every ``step`` seconds."""
        ...

    def alerts(self) -> list[Alert]:
        """Pending and firing alerts."""
        ...


class AsyncPrometheusAPI(Protocol):
    """The same queries as coroutines, for callers inside an event loop."""

    async def query(self, expr: str, *, at: float | None = None) -> list[Sample]:
        """Evaluate an instant query (at ``at``, default now).

        Raises:
            PrometheusAPIError: Prometheus could not be reached or rejected the query.
        """
        ...

    async def query_range(
        self, expr: str, *, start: float, end: float, step: float
    ) -> list[Series]:
        """Evaluate a range query from ``start`` to ``end`` every ``step`` seconds."""
        ...

    async def alerts(self) -> list[Alert]:
        """Pending and firing alerts."""
        ...


def promql_string(value: str) -> str:
    """Quote ``value`` as a PromQL string literal (for label matchers)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


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


def _label_values(data: Any) -> list[str]:
    return [str(value) for value in data or []]


class AsyncPrometheusClient(HttpClient):
    """:class:`AsyncPrometheusAPI` over HTTP.

    Args:
        base_url: e.g. ``http://127.0.0.1:19090`` (no ``/api/v1``); the lab's is
            ``LabState.prometheus_url``.
        timeout: seconds per request.
        options: TLS, basic auth, Bearer token, headers.
        session: an aiohttp session to reuse (the caller closes it); without one the client
            holds a session inside ``async with`` and opens one per call otherwise.

    Raises:
        ConfigError: ``base_url`` is not an http(s) URL, or ``timeout`` <= 0.
    """

    what = "prometheus"
    url_field = "prometheus_url"
    url_example = "http://127.0.0.1:19090"
    error = PrometheusAPIError

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        options: HttpOptions | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        super().__init__(base_url, timeout=timeout, options=options, session=session)

    async def __aenter__(self) -> AsyncPrometheusClient:
        await super().__aenter__()
        return self

    async def _get(
        self, path: str, params: Iterable[tuple[str, str]] | Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        """HTTP status and ``data`` of a successful answer to ``GET <base>/api/v1<path>``."""
        url = f"{self.base_url}/api/v1{path}"
        status, raw = await self._send("GET", f"/api/v1{path}", ok=None, params=params)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise PrometheusAPIError(
                f"prometheus: GET {url}: HTTP {status}, not a Prometheus answer", status
            )
        if body.get("status") != "success":
            raise PrometheusAPIError(
                f"prometheus: GET {url}: HTTP {status} {body.get('errorType', 'error')}: "
                f"{body.get('error', 'no detail')}",
                status,
            )
        return status, body.get("data")

    async def _parsed(
        self, path: str, parse: Callable[[Any], T], params: Any = None, context: str = ""
    ) -> T:
        """``parse(data)`` of the answer to ``GET <base>/api/v1<path>``.

        Raises:
            PrometheusAPIError: as :meth:`_get`, or ``data`` is not of the documented shape.
        """
        status, data = await self._get(path, params)
        try:
            return parse(data if data is not None else {})
        except PrometheusAPIError as exc:
            raise PrometheusAPIError(str(exc), status) from exc
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise PrometheusAPIError(
                f"prometheus: GET {self.base_url}/api/v1{path}: malformed answer{context}: "
                f"{type(exc).__name__}: {exc}",
                status,
            ) from exc

    async def query(self, expr: str, *, at: float | None = None) -> list[Sample]:
        """``GET /api/v1/query``: an instant vector (a scalar comes back as one unlabelled
        sample).

        Raises:
            PrometheusAPIError: also when the result is a range vector (the message says
                to use :meth:`query_range`).
        """
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(float(at))
        return await self._parsed(
            "/query", lambda data: _samples(data, expr), params, f" (query {expr!r})"
        )

    async def query_range(
        self, expr: str, *, start: float, end: float, step: float
    ) -> list[Series]:
        """``GET /api/v1/query_range``: one series per label set."""
        params = {"query": expr, "start": repr(start), "end": repr(end), "step": repr(step)}
        return await self._parsed("/query_range", _series, params, f" (query {expr!r})")

    async def alerts(self) -> list[Alert]:
        """``GET /api/v1/alerts``: pending and firing alerts."""
        return await self._parsed("/alerts", _alerts)

    async def targets(self) -> list[Target]:
        """``GET /api/v1/targets?state=active``: active scrape targets and their health."""
        return await self._parsed("/targets", _targets, {"state": "active"})

    async def label_values(
        self,
        label: str,
        *,
        match: Iterable[str] = (),
        start: float | None = None,
        end: float | None = None,
    ) -> list[str]:
        """``GET /api/v1/label/<label>/values``: the values of ``label`` (of the series
        matching every ``match`` selector, between ``start`` and ``end`` when given)."""
        params = [("match[]", selector) for selector in match]
        params += [(k, repr(v)) for k, v in (("start", start), ("end", end)) if v is not None]
        return await self._parsed(f"/label/{label}/values", _label_values, params)


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
    """Blocking :class:`PrometheusAPI`: each call runs :class:`AsyncPrometheusClient` on a
    short-lived event loop (on a worker thread when called from inside a loop).

    Args:
        base_url: e.g. ``http://127.0.0.1:19090``.
        timeout: seconds per request.
        options: TLS, basic auth, Bearer token, headers.

    Raises:
        ConfigError: ``base_url`` is not an http(s) URL, or ``timeout`` <= 0.
    """

    def __init__(
        self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT, options: HttpOptions | None = None
    ) -> None:
        self._client = AsyncPrometheusClient(base_url, timeout=timeout, options=options)
        self.base_url = self._client.base_url

    def query(self, expr: str, *, at: float | None = None) -> list[Sample]:
        """See :meth:`AsyncPrometheusClient.query`."""
        return _run_sync(lambda: self._client.query(expr, at=at))

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> list[Series]:
        """See :meth:`AsyncPrometheusClient.query_range`."""
        return _run_sync(lambda: self._client.query_range(expr, start=start, end=end, step=step))

    def alerts(self) -> list[Alert]:
        """See :meth:`AsyncPrometheusClient.alerts`."""
        return _run_sync(self._client.alerts)

    def targets(self) -> list[Target]:
        """See :meth:`AsyncPrometheusClient.targets`."""
        return _run_sync(self._client.targets)

    def label_values(
        self,
        label: str,
        *,
        match: Iterable[str] = (),
        start: float | None = None,
        end: float | None = None,
    ) -> list[str]:
        """See :meth:`AsyncPrometheusClient.label_values`."""
        return _run_sync(
            lambda: self._client.label_values(label, match=match, start=start, end=end)
        )


__all__ = [
    "DEFAULT_TIMEOUT",
    "Alert",
    "AsyncPrometheusAPI",
    "AsyncPrometheusClient",
    "PrometheusAPI",
    "PrometheusClient",
    "Sample",
    "Series",
    "Target",
    "promql_string",
]
