"""The responder: Alertmanager's webhook receiver, incident book and action runner.

HTTP API (aiohttp; every route except ``/healthz`` needs ``Authorization:
Bearer <token>``, compared in constant time):

* ``POST /v1/alertmanager``: an Alertmanager webhook payload (version 4).
  Answers at once after storing it: 200 with what changed, 400 naming the
  invalid field, 401, 413 above ``max_body_bytes``, 500 when the database
  failed (nothing stored; Alertmanager's retry is then safe). Actions run in
  the background.
* ``GET /v1/notifications``, ``/v1/incidents``, ``/v1/actions``: JSON
  ``{"notifications": [...]}`` etc. (see :mod:`stormwatch.alerts.responder.records`),
  oldest first; ``?limit=N`` (default 1000) keeps the latest N. Times are Unix seconds.
* ``GET /healthz``: ``{"status": "ok"}``, no authentication.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from stormwatch.alerts.actions.confirm_restart import ConfirmRestartSettings
from stormwatch.alerts.actions.playbook import Playbook, playbook_from_policy
from stormwatch.alerts.backend import (
    LabBackend,
    PlatformBackend,
    PlatformSettings,
    make_backend,
)
from stormwatch.alerts.errors import StoreError
from stormwatch.alerts.policy import Policy, default_policy
from stormwatch.alerts.postmortem import (
    PostMortemFiles,
    PostMortemWriter,
    recovery_visible,
    write_incident_postmortem,
)
from stormwatch.alerts.prometheus import PrometheusClient
from stormwatch.alerts.responder.action_runner import ActionRunner, StoreWorker
from stormwatch.alerts.responder.audit import AuditEntry, AuditLog
from stormwatch.alerts.responder.auth import bearer_matches, read_token
from stormwatch.alerts.responder.guards import Guardrails
from stormwatch.alerts.responder.payload import WebhookMessage
from stormwatch.alerts.responder.store import Store
from stormwatch.dashboards.annotations import Annotator
from stormwatch.errors import ConfigError
from stormwatch.lab.errors import LabError
from stormwatch.lab.state import load_lab_state

log = logging.getLogger(__name__)

#: Default request body limit: 1 MiB. Alertmanager's payload is ~1 KiB per alert,
#: so this allows groups of several hundred alerts.
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Default and largest ``limit`` of the list endpoints.
DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 100_000


@dataclass(frozen=True, kw_only=True)
class ResponderSettings:
    """How the responder runs.

    Attributes:
        db_path: SQLite database (created if missing; its folder must exist).
        token_file: file holding the Bearer token clients must send.
        host: listen address (default loopback).
        port: listen port; 0 picks a free one (see :attr:`Responder.url`).
            Default 19095, the lab's port (docs/ARCHITECTURE.md).
        prometheus_url: Prometheus base URL for read-only checks such as
            ``confirm_restart``; None skips them.
        max_body_bytes: largest accepted request body (default 1 MiB).
        confirm: timing of ``confirm_restart``.
        policy: alert -> actions and the guards (default :func:`default_policy`:
            ``StormwatchRankStalled`` -> ``confirm_restart`` only).
        audit_jsonl: JSONL mirror of the audit log (default ``<db>.audit.jsonl``).
        lab_run_dir: the lab's run directory; enables the lab backend for
            remedial actions (node map from ``lab.json``, diagnostics in
            ``<run-dir>/responder/diagnostics``). None: no backend. Post-mortems
            read the job's rank logs, dumps, spans, agent events and chaos
            journals from it.
        platform: which backend remedial actions use: ``lab`` (needs
            :attr:`lab_run_dir`), ``kubernetes`` or ``slurm`` (alerts/backend/).
        platform_settings: the ``kubernetes``/``slurm`` settings (``--platform-config``);
            their diagnostics go to ``<db folder>/diagnostics``.
        postmortem_dir: where a post-mortem is written when an incident closes
            (``incident-<id>/``; default ``<db folder>/postmortems``).
        postmortems: False writes none (``--no-postmortems``).
    """

    db_path: Path
    token_file: Path
    host: str = "127.0.0.1"
    port: int = 19095
    prometheus_url: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    confirm: ConfirmRestartSettings = field(default_factory=ConfirmRestartSettings)
    policy: Policy = field(default_factory=default_policy)
    audit_jsonl: Path | None = None
    lab_run_dir: Path | None = None
    platform: str = "lab"
    platform_settings: PlatformSettings = field(default_factory=PlatformSettings)
    postmortem_dir: Path | None = None
    postmortems: bool = True

    @property
    def postmortem_path(self) -> Path:
        """Where post-mortems go (:attr:`postmortem_dir` or ``<db folder>/postmortems``)."""
        return self.postmortem_dir or Path(self.db_path).parent / "postmortems"

    def write_postmortem(self, incident_id: int) -> PostMortemFiles:
        """Write the post-mortem of ``incident_id`` from this responder's sources (blocking).

        Raises:
            UnknownIncident: no such incident.
            StoreError: the database cannot be read.
        """
        return write_incident_postmortem(
            db_path=self.db_path,
            incident_id=incident_id,
            postmortem_dir=self.postmortem_path,
            lab_run_dir=self.lab_run_dir,
            prometheus_url=self.prometheus_url,
        )

    @property
    def audit_path(self) -> Path:
        """Where the audit JSONL goes (:attr:`audit_jsonl` or ``<db>.audit.jsonl``)."""
        db = Path(self.db_path)
        return self.audit_jsonl or db.with_name(db.name + ".audit.jsonl")

    def lab_backend(self) -> LabBackend | None:
        """The lab backend for :attr:`lab_run_dir` (None without one).

        Raises:
            ConfigError: ``lab.json`` exists but is not a readable lab state file.
        """
        if self.lab_run_dir is None:
            return None
        run_dir = Path(self.lab_run_dir)
        try:
            state = load_lab_state(run_dir)
        except LabError as exc:
            raise ConfigError(f"lab_run_dir: {exc}") from exc
        nodes = {} if state is None else {n.name: n.metrics_dir for n in state.nodes}
        return LabBackend(
            diagnostics_dir=run_dir / "responder" / "diagnostics", node_metrics_dirs=nodes
        )

    def backend(self) -> PlatformBackend | None:
        """The backend :attr:`platform` names (lab: :meth:`lab_backend`, None without a run dir).

        Raises:
            ConfigError: unknown platform, or an unreadable ``lab.json``.
            BackendError: the Kubernetes client finds no cluster configuration.
        """
        if self.platform == "lab":
            return self.lab_backend()
        return make_backend(
            self.platform,
            self.platform_settings,
            diagnostics_dir=Path(self.db_path).parent / "diagnostics",
        )

    def __post_init__(self) -> None:
        if self.platform not in ("lab", "kubernetes", "slurm"):
            raise ConfigError(f"platform: must be lab, kubernetes or slurm (got {self.platform!r})")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port: must be 0..65535 (got {self.port})")
        if not self.host:
            raise ConfigError("host: must not be empty (use 127.0.0.1)")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes: must be >= 1024 (got {self.max_body_bytes})")
        if not Path(self.db_path).parent.is_dir():
            raise ConfigError(
                f"db_path: folder {Path(self.db_path).parent} does not exist; create it first"
            )


def _field_errors(exc: ValidationError) -> list[dict[str, str]]:
    fields = []
    for error in exc.errors(include_url=False):
        path = ".".join(str(part) for part in error["loc"]) or "body"
        fields.append({"field": path, "message": error["msg"]})
    return fields


def _json_error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


class Responder:
    """The running responder; an async context manager that serves until exit.

    Args:
        settings: see :class:`ResponderSettings`.
        playbook: alert name -> actions (default: :func:`default_playbook`
            with a Prometheus client for ``settings.prometheus_url``).
        clock: Unix time source (seconds).
        annotator: Grafana annotations of incidents opened/closed and actions run
            (default :meth:`Annotator.from_env`: off unless ``STORMWATCH_GRAFANA_URL``
            is set); closed on exit.

    Raises (on enter):
        ConfigError: unreadable token file, or a bad Prometheus URL.
        StoreError: the database cannot be opened.
        ConfigError: the address cannot be bound (in use, not local).
    """

    def __init__(
        self,
        settings: ResponderSettings,
        *,
        playbook: Playbook | None = None,
        clock: Callable[[], float] = time.time,
        annotator: Annotator | None = None,
    ) -> None:
        self.settings = settings
        self.annotator = annotator if annotator is not None else Annotator.from_env()
        self._playbook = playbook
        self._clock = clock
        self._token = read_token(settings.token_file, "token_file")
        self._stack = AsyncExitStack()
        self._db: StoreWorker | None = None
        self._runner: ActionRunner | None = None
        self._audit: AuditLog | None = None
        self._postmortems: PostMortemWriter | None = None
        self.url = ""

    async def __aenter__(self) -> Responder:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _start(self) -> None:
        settings = self.settings
        playbook = self._playbook
        if playbook is None:
            prometheus = None
            if settings.prometheus_url:
                prometheus = PrometheusClient(settings.prometheus_url)
                self._stack.push_async_callback(prometheus.aclose)
            playbook = playbook_from_policy(
                settings.policy,
                prometheus=prometheus,
                backend=settings.backend(),
                confirm=settings.confirm,
            )
        self._playbook = playbook

        self._db = db = StoreWorker(Store(settings.db_path))
        self._stack.callback(db.close)
        self._audit = audit = AuditLog(settings.db_path, settings.audit_path)
        self._stack.callback(audit.close)
        guardrails = Guardrails(settings.policy, audit, clock=self._clock)
        self._stack.push_async_callback(asyncio.to_thread, self.annotator.close)
        self._runner = runner = ActionRunner(
            db, playbook, clock=self._clock, guardrails=guardrails, annotator=self.annotator
        )
        self._stack.push_async_callback(runner.aclose)
        if settings.postmortems:
            self._postmortems = writer = PostMortemWriter(
                settings.write_postmortem,
                recovered=lambda pm: recovery_visible(pm, settings.lab_run_dir),
            )
            self._stack.push_async_callback(writer.aclose)

        app = web.Application(
            client_max_size=settings.max_body_bytes, middlewares=[self._authenticate]
        )
        app.router.add_post("/v1/alertmanager", self._webhook)
        app.router.add_get(
            "/v1/notifications", self._list("notifications", lambda s, n: s.notifications(limit=n))
        )
        app.router.add_get(
            "/v1/incidents", self._list("incidents", lambda s, n: s.incidents(limit=n))
        )
        app.router.add_get("/v1/actions", self._list("actions", lambda s, n: s.actions(limit=n)))
        app.router.add_post("/v1/actions/{action_id}/approve", self._approve)
        app.router.add_get("/v1/audit", self._audit_log)
        app.router.add_get("/healthz", self._health)
        app_runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await app_runner.setup()
        self._stack.push_async_callback(app_runner.cleanup)
        site = web.TCPSite(app_runner, settings.host, settings.port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(
                f"listen: cannot listen on {settings.host}:{settings.port}: "
                f"{exc.strerror or exc}; pick another --listen address"
            ) from exc
        host, port = app_runner.addresses[0][:2]
        self.url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"

        pending = await db.run(
            lambda s: s.recover(now=self._clock(), retry_safe=playbook.retry_safe)
        )
        for action_id in pending:
            runner.submit(action_id)
        log.info("responder listening on %s (%d actions resumed)", self.url, len(pending))

    # -- HTTP -----------------------------------------------------------------

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        if not bearer_matches(request.headers.get("Authorization"), self._token):
            return web.json_response(
                {"error": "missing or invalid bearer token"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="stormwatch-responder"'},
            )
        return await handler(request)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _webhook(self, request: web.Request) -> web.Response:
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return _json_error(413, f"request body larger than {limit} bytes")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _json_error(413, f"request body larger than {limit} bytes")
        except ConnectionResetError:
            # The sender gave up mid-body (e.g. Alertmanager's notify timeout); it retries.
            log.info("sender went away before the whole body arrived; nothing stored")
            return _json_error(400, "connection lost before the whole body arrived")
        try:
            message = WebhookMessage.model_validate_json(body)
        except ValidationError as exc:
            fields = _field_errors(exc)
            first = fields[0]
            return _json_error(
                400,
                f"invalid Alertmanager webhook payload: {first['field']}: {first['message']}",
                fields=fields,
            )
        assert self._db is not None and self._runner is not None and self._playbook is not None
        kinds_for = self._playbook.kinds_for
        received = self._clock()
        try:
            done = await self._db.run(
                lambda s: s.ingest(message, received_at=received, actions_for=kinds_for)
            )
        except StoreError as exc:
            log.error("cannot store notification %s: %s", message.group_key, exc)
            return _json_error(500, "the notification could not be stored; retry")
        for action_id in done.new_actions:
            self._runner.submit(action_id)
        self._annotate_incidents(message, done.opened, "opened")
        self._annotate_incidents(message, done.closed, "closed")
        if self._postmortems is not None:
            for incident_id in done.closed:
                self._postmortems.submit(incident_id)
        log.info(
            "notification %d (%s, %d alerts): %d new, %d duplicates, opened %s, joined %s,"
            " closed %s",
            done.notification_id,
            message.status,
            len(message.alerts),
            done.new_alerts,
            done.duplicates,
            done.opened,
            done.joined,
            done.closed,
        )
        return web.json_response(
            {
                "notification_id": done.notification_id,
                "new_alerts": done.new_alerts,
                "duplicates": done.duplicates,
                "incidents_opened": done.opened,
                "incidents_joined": done.joined,
                "incidents_closed": done.closed,
                "actions_started": done.new_actions,
            }
        )

    def _annotate_incidents(
        self, message: WebhookMessage, incident_ids: list[int], what: str
    ) -> None:
        """One Grafana annotation per incident opened or closed (queued; never raises)."""
        name = message.common_labels.get("alertname") or message.group_labels.get(
            "alertname", "alert"
        )
        for incident_id in incident_ids:
            self.annotator.annotate(
                f"incident {incident_id} {what}: {name} ({message.group_key})",
                ("stormwatch", "incident", f"incident-{what}", name),
            )

    async def _approve(self, request: web.Request) -> web.Response:
        """``POST /v1/actions/{id}/approve`` (body ``{"actor": str}``, optional): 200
        ``{"action_id", "approved": true}``; 404 unknown action; 409 not waiting for approval."""
        raw = request.match_info["action_id"]
        if not raw.isdigit():
            return _json_error(404, f"no action {raw!r}")
        action_id = int(raw)
        actor = "cli"
        if request.can_read_body:
            try:
                body = json.loads(await request.read() or b"{}")
                actor = f"cli:{str(body.get('actor') or 'unknown')[:64]}"
            except (ValueError, AttributeError):
                return _json_error(400, 'body must be a JSON object such as {"actor": "alice"}')
        assert self._db is not None and self._audit is not None
        audit = self._audit
        record = await self._db.run(lambda s: s.action(action_id))
        if record is None:
            return _json_error(404, f"no action {action_id}")
        waiting = await asyncio.to_thread(audit.has, action_id, "awaiting_approval")
        approved = await asyncio.to_thread(audit.has, action_id, "approved")
        if record.status != "running" or not waiting or approved:
            return _json_error(
                409,
                f"action {action_id} ({record.kind}, {record.status}) is not waiting for approval",
            )
        await asyncio.to_thread(
            audit.record,
            AuditEntry(
                time=self._clock(),
                actor=actor,
                event="approved",
                action_id=action_id,
                incident_id=record.incident_id,
                kind=record.kind,
                reason="approved by an operator",
            ),
        )
        log.info("action %d approved by %s", action_id, actor)
        return web.json_response({"action_id": action_id, "approved": True})

    async def _audit_log(self, request: web.Request) -> web.Response:
        """``GET /v1/audit[?limit=N]`` -> ``{"audit": [entry]}``, oldest first."""
        raw = request.query.get("limit", str(DEFAULT_LIST_LIMIT))
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST_LIMIT:
            return _json_error(400, f"limit: must be an integer 1..{MAX_LIST_LIMIT} (got {raw!r})")
        assert self._audit is not None
        entries = await asyncio.to_thread(self._audit.entries, limit=int(raw))
        return web.json_response({"audit": [e.model_dump(mode="json") for e in entries]})

    def _list(
        self, name: str, read: Callable[[Store, int], Sequence[BaseModel]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            raw = request.query.get("limit", str(DEFAULT_LIST_LIMIT))
            if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST_LIMIT:
                return _json_error(
                    400,
                    f"limit: must be an integer 1..{MAX_LIST_LIMIT} (got {raw!r})",
                    fields=[
                        {"field": "limit", "message": f"must be an integer 1..{MAX_LIST_LIMIT}"}
                    ],
                )
            limit = int(raw)
            assert self._db is not None
            try:
                records = await self._db.run(lambda s: read(s, limit))
            except StoreError as exc:
                log.error("%s", exc)
                return _json_error(500, f"cannot read {name}")
            return web.json_response({name: [r.model_dump(mode="json") for r in records]})

        return handler


async def serve(
    settings: ResponderSettings,
    *,
    stop: asyncio.Event,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Run the responder until ``stop`` is set; ``on_ready(url)`` once it listens."""
    async with Responder(settings) as responder:
        if on_ready is not None:
            on_ready(responder.url)
        await stop.wait()


__all__ = [
    "DEFAULT_LIST_LIMIT",
    "DEFAULT_MAX_BODY_BYTES",
    "Responder",
    "ResponderSettings",
    "serve",
]
