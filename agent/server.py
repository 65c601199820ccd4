"""The agent's HTTP APIs (aiohttp): a read-only listener and the fault API's own.

Read-only listener (``--listen``; TLS and basic auth from ``--web-config-file``):

=========================  ======================================================
``GET /metrics``           Prometheus text format 0.0.4, the cached exposition
                           (:mod:`stormwatch.agent.exposition`)
``GET /healthz``           liveness + collector health (JSON)
``GET /v1/ranks``          ranks seen on this node (JSON)
``GET /v1/events``         rank events: exits, hangs, stragglers (JSON; ``?since=``
                           Unix seconds, ``?kind=``, ``?job=`` filter)
=========================  ======================================================

Fault API listener (``--fault-api-listen``; off unless given; every request
needs the Bearer token of ``--token-file``; TLS from the web config):

=========================  ======================================================
``POST /v1/faults``        apply a fault -> 201, or 200 for a repeat (409 for a
                           repeat of a fault that failed: retry with a new id)
``GET /v1/faults``         every fault in the ledger
``GET /v1/faults/{id}``    one fault
``DELETE /v1/faults/{id}`` revert a fault now
=========================  ======================================================

Errors are JSON ``{"error": "..."}``, aiohttp's own too (an unknown path's 404, a
method's 405, a body's 413); a 400 also lists ``fields``
(``[{"field": "rank", "message": "..."}]``). A missing or wrong basic-auth
password gets 401 with ``WWW-Authenticate: Basic``; a missing or wrong token
401 with ``WWW-Authenticate: Bearer``. Request bodies above the
configured size get 413; a ``POST`` whose ``Content-Type`` is not
``application/json`` gets 415; JSON nested deeper than :data:`MAX_JSON_DEPTH` gets 400. Blocking work (collection, SQLite, signals, bcrypt) runs in
the default executor so the event loop keeps answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import hmac
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from stormwatch import faults as fault_kinds
from stormwatch.agent.collectors.base import CollectorSet
from stormwatch.agent.exposition import GZIP_LEVEL, ExpositionCache
from stormwatch.agent.faults import FaultManager
from stormwatch.agent.textformat import close, render
from stormwatch.agent.watch.events import EventLog
from stormwatch.agent.watch.ranks import RankWatcher
from stormwatch.agent.webconfig import BasicAuth
from stormwatch.faults import FaultError, InvalidFaultRequest

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Deepest accepted nesting of a request body (a fault request is 1 deep).
MAX_JSON_DEPTH = 32


def _too_deep(raw: bytes) -> bool:
    """Whether ``raw``'s brackets nest deeper than :data:`MAX_JSON_DEPTH` (outside strings).

    Checked before ``json.loads``, whose recursion would otherwise overflow.
    """
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


#: Headers of aiohttp's plain-text error body, replaced by the JSON body's.
_BODY_HEADERS = frozenset({"content-type", "content-length"})


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


@dataclasses.dataclass(frozen=True)
class ApiDeps:
    """What the HTTP handlers use.

    Attributes:
        node: node name (in ``/healthz`` and ``/v1/ranks``).
        gpu_backend: ``nvml``, ``sim`` or ``none`` (GPU collectors off).
        registry: the registry ``/metrics`` renders when there is no ``exposition``.
        collectors: for collector health in ``/healthz``.
        ranks: the rank watcher.
        faults: the fault manager.
        token: the fault API's Bearer token; None: every fault request gets 401.
        max_request_bytes: request body limit.
        unsupported_metrics: ``() -> {gpu index: {DCGM metric: reason}}`` for
            ``/healthz`` (what ``stormwatch_metric_supported 0`` means, and why).
        exposition: the cached exposition ``/metrics`` serves (None:
            the registry rendered per scrape).
        events: the rank event log ``/v1/events`` serves (None: an empty list).
        basic_auth: users of the read-only listener (None or empty: no auth).
        headers: extra response headers (web config ``http_server_config.headers``).
    """

    node: str
    gpu_backend: str
    registry: CollectorRegistry
    collectors: CollectorSet
    ranks: RankWatcher
    faults: FaultManager
    token: str | None
    max_request_bytes: int
    unsupported_metrics: Callable[[], dict[str, dict[str, str]]] = dict
    exposition: ExpositionCache | None = None
    events: EventLog | None = None
    basic_auth: BasicAuth | None = None
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


def build_app(deps: ApiDeps) -> web.Application:
    """The read-only application (``/metrics``, ``/healthz``, ``/v1/ranks``, ``/v1/events``)."""
    api = _Api(deps)
    app = _application(deps, auth=api.basic_auth, api=api)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/healthz", api.healthz)
    app.router.add_get("/v1/ranks", api.ranks)
    app.router.add_get("/v1/events", api.events)
    return app


def build_fault_app(deps: ApiDeps) -> web.Application:
    """The fault API's application (``/v1/faults``), every route behind the Bearer token."""
    api = _Api(deps)
    app = _application(deps, auth=api.bearer_auth, api=api)
    app.router.add_post("/v1/faults", api.post_fault)
    app.router.add_get("/v1/faults", api.list_faults)
    app.router.add_get("/v1/faults/{id}", api.get_fault)
    app.router.add_delete("/v1/faults/{id}", api.delete_fault)
    return app


def _application(deps: ApiDeps, *, auth: Middleware, api: _Api) -> web.Application:
    """An application with the request size limit, the extra headers, JSON errors and
    ``auth``."""
    return web.Application(
        client_max_size=deps.max_request_bytes, middlewares=[api.headers, api.json_errors, auth]
    )


def gzip_wanted(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header asks for gzip: ``gzip`` (or ``x-gzip``) named
    with a q-value above 0 (RFC 9110, section 12.5.3); ``gzip;q=0`` refuses it. Like
    prometheus-client's ``gzip_accepted``, which ignores q-values, ``*`` alone does not
    ask for it; a q-value that is not a number counts as 1."""
    wanted = False
    for item in accept_encoding.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        if coding.lower() not in ("gzip", "x-gzip"):
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                # Quietly: a q-value that is not a number counts as 1, as documented above.
                with contextlib.suppress(ValueError):
                    q = float(value)
                if math.isnan(q):  # "nan" parses, and is not a number either
                    q = 1.0
        wanted = wanted or q > 0
    return wanted


class _Api:
    def __init__(self, deps: ApiDeps) -> None:
        self._deps = deps

    async def _blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    @web.middleware
    async def headers(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            exc.headers.update(self._deps.headers)
            raise
        response.headers.update(self._deps.headers)
        return response

    @web.middleware
    async def json_errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """aiohttp's own error answers (no route 404, 405, 413) as JSON ``{"error": ...}``,
        like the handlers' errors, keeping their status and headers (``Allow`` of a 405)."""
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400 or exc.content_type == "application/json":
                raise
            if isinstance(exc, web.HTTPMethodNotAllowed):
                allowed = ", ".join(sorted(exc.allowed_methods))
                message = f"method {request.method} not allowed on {request.path}; use {allowed}"
            elif isinstance(exc, web.HTTPNotFound):
                message = f"no such path {request.path} on this listener"
            elif isinstance(exc, web.HTTPRequestEntityTooLarge):
                message = (
                    f"body: larger than the {self._deps.max_request_bytes}-byte limit; "
                    "send a smaller request"
                )
            else:
                message = exc.reason
            headers = {k: v for k, v in exc.headers.items() if k.lower() not in _BODY_HEADERS}
            return web.json_response({"error": message}, status=exc.status, headers=headers)

    @web.middleware
    async def basic_auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        users = self._deps.basic_auth
        if users is None or not users.enabled:
            return await handler(request)
        given = BasicAuth.parse(request.headers.get("Authorization", ""))
        if given is not None and (
            users.cached(*given) or await self._blocking(users.check, *given)
        ):
            return await handler(request)
        return web.json_response(
            {"error": "missing or wrong basic-auth user or password"},
            status=401,
            headers={"WWW-Authenticate": 'Basic realm="stormwatch-agent"'},
        )

    @web.middleware
    async def bearer_auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        expected = self._deps.token
        challenge = {"WWW-Authenticate": 'Bearer realm="stormwatch-agent"'}
        if expected is None:
            return web.json_response(
                {"error": "fault API disabled: start the agent with --token-file"},
                status=401,
                headers=challenge,
            )
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), expected.encode()
        ):
            return web.json_response(
                {"error": "missing or invalid Bearer token"}, status=401, headers=challenge
            )
        return await handler(request)

    # ------------------------------------------------------------ read-only
    async def metrics(self, request: web.Request) -> web.Response:
        """The exposition in the format the ``Accept`` header prefers (prometheus-client's
        ``choose_encoder``: OpenMetrics 1.0 or the text format), gzipped when
        ``Accept-Encoding`` accepts it (:func:`gzip_wanted`; from the cache, the cached
        part compressed once per render: :meth:`.ExpositionCache.gzipped`)."""
        _, content_type = choose_encoder(request.headers.get("Accept", ""))
        om = content_type.startswith("application/openmetrics-text")
        gzipped = gzip_wanted(request.headers.get("Accept-Encoding", ""))
        cache = self._deps.exposition
        headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        if cache is None:
            body = await self._blocking(_render_registry, self._deps.registry, om)
            if gzipped:
                body = await self._blocking(gzip.compress, body, GZIP_LEVEL)
            return web.Response(body=body, headers=headers)
        serve = cache.gzipped if gzipped else cache.body
        if cache.stale_for(om) or (gzipped and not cache.gzip_ready(om)):
            body = await self._blocking(serve, om)
        else:  # the cached bytes plus the live age gauges: microseconds, no executor hop
            body = serve(om)
        return web.Response(body=body, headers=headers)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "node": self._deps.node,
                "gpu_backend": self._deps.gpu_backend,
                "collectors": self._deps.collectors.health(),
                "unsupported_metrics": self._deps.unsupported_metrics(),
                "proc_connector": {
                    "up": self._deps.ranks.exits.available,
                    "reason": self._deps.ranks.exits.reason,
                },
            }
        )

    async def ranks(self, request: web.Request) -> web.Response:
        rows = [dataclasses.asdict(info) for info in self._deps.ranks.ranks()]
        return web.json_response({"node": self._deps.node, "ranks": rows})

    async def events(self, request: web.Request) -> web.Response:
        since_raw = request.query.get("since")
        try:
            since = None if since_raw is None else float(since_raw)
        except ValueError:
            return _error(
                400,
                f"since: expected Unix seconds (got {since_raw!r})",
                fields=[{"field": "since", "message": "not a number"}],
            )
        log_ = self._deps.events
        rows = (
            []
            if log_ is None
            else [
                e.to_record()
                for e in log_.events(
                    since=since, kind=request.query.get("kind"), job=request.query.get("job")
                )
            ]
        )
        return web.json_response({"node": self._deps.node, "events": rows})

    # --------------------------------------------------------------- faults
    async def post_fault(self, request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            return _error(
                415,
                f"Content-Type must be application/json (got {request.content_type or 'none'})",
            )
        raw = await request.read()  # 413 above client_max_size
        if _too_deep(raw):
            return _error(
                400,
                f"body: JSON nested deeper than {MAX_JSON_DEPTH} levels",
                fields=[{"field": "body", "message": "nested too deeply"}],
            )
        try:
            body = json.loads(raw)
        except RecursionError:  # not reached after _too_deep; kept as a backstop
            return _error(
                400,
                "body: JSON nested too deeply",
                fields=[{"field": "body", "message": "nested too deeply"}],
            )
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return _error(
                400,
                f"body: invalid JSON ({exc})",
                fields=[{"field": "body", "message": "invalid JSON"}],
            )
        try:
            # Off the event loop: the first request imports the registry (~0.1 CPU-s).
            spec = await self._blocking(fault_kinds.parse_request, body)
            record, created = await self._blocking(self._deps.faults.apply, spec)
            self._changed()
        except InvalidFaultRequest as exc:
            fields = [{"field": field, "message": message} for field, message in exc.problems]
            return _error(400, f"invalid fault request: {exc}", fields=fields)
        except FaultError as exc:
            return _error(exc.http_status, str(exc))
        return web.json_response(record.model_dump(mode="json"), status=201 if created else 200)

    async def list_faults(self, request: web.Request) -> web.Response:
        records = await self._blocking(self._deps.faults.records)
        return web.json_response({"faults": [r.model_dump(mode="json") for r in records]})

    async def get_fault(self, request: web.Request) -> web.Response:
        try:
            record = await self._blocking(self._deps.faults.get, request.match_info["id"])
        except FaultError as exc:
            return _error(exc.http_status, str(exc))
        return web.json_response(record.model_dump(mode="json"))

    async def delete_fault(self, request: web.Request) -> web.Response:
        try:
            record = await self._blocking(self._deps.faults.revert, request.match_info["id"])
        except FaultError as exc:
            return _error(exc.http_status, str(exc))
        self._changed()
        return web.json_response(record.model_dump(mode="json"))

    def _changed(self) -> None:
        """A fault changed: the next scrape must show it (not the cached exposition)."""
        if self._deps.exposition is not None:
            self._deps.exposition.invalidate()


def _render_registry(registry: CollectorRegistry, openmetrics_format: bool) -> bytes:
    """Every family of ``registry`` in one format (the uncached path)."""
    body = render(registry.collect(), openmetrics_format=openmetrics_format)
    return close(body, openmetrics_format=openmetrics_format)


__all__ = ["MAX_JSON_DEPTH", "ApiDeps", "build_app", "build_fault_app"]
