"""The responder's HTTP API (aiohttp): the routes over the responder's collaborators.

Every route except ``/healthz`` needs ``Authorization: Bearer <token>``, compared in
constant time:

* ``POST /v1/alertmanager``: an Alertmanager webhook payload (version 4).
  Answers at once after storing it: 200 with what changed, 400 naming the
  invalid field, 401, 413 above ``max_body_bytes``, 500 when the database
  failed (nothing stored; Alertmanager's retry is then safe). Actions run in
  the background.
* ``GET /v1/notifications``, ``/v1/incidents``, ``/v1/actions``: JSON
  ``{"notifications": [...]}`` etc. (see :mod:`stormwatch.contracts.responder`),
  oldest first; ``?limit=N`` (default 1000) keeps the latest N. Times are Unix seconds.
* ``POST /v1/actions/{id}/approve``, ``GET /v1/audit``: approvals and the audit log.
* ``GET /healthz``: ``{"status": "ok"}``, no authentication.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from stormwatch.alerts.errors import StoreError
from stormwatch.alerts.incident_report import PostMortemWriter
from stormwatch.alerts.responder.action_runner import ActionRunner, StoreWorker
from stormwatch.alerts.responder.audit import AuditEntry, AuditLog
from stormwatch.alerts.responder.auth import bearer_matches
from stormwatch.alerts.responder.payload import WebhookMessage
from stormwatch.alerts.responder.settings import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT
from stormwatch.alerts.responder.store import Store
from stormwatch.dashboards.annotations import Annotator

log = logging.getLogger(__name__)


def _field_errors(exc: ValidationError) -> list[dict[str, str]]:
    fields = []
    for error in exc.errors(include_url=False):
        path = ".".join(str(part) for part in error["loc"]) or "body"
        fields.append({"field": path, "message": error["msg"]})
    return fields


def _json_error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


class ResponderApi:
    """The routes, over the collaborators the :class:`~.service.Responder` built.

    Args:
        token: the Bearer token clients must send.
        max_body_bytes: largest accepted request body.
        db: the store, on its worker thread.
        runner: runs the actions a notification creates.
        kinds_for: action kinds for an alert name (the playbook's).
        audit: the audit log (approvals).
        annotator: Grafana annotations of incidents opened and closed.
        postmortems: writes a post-mortem when an incident closes (None: off).
        clock: Unix time source (seconds).
    """

    def __init__(
        self,
        *,
        token: str,
        max_body_bytes: int,
        db: StoreWorker,
        runner: ActionRunner,
        kinds_for: Callable[[str], Sequence[str]],
        audit: AuditLog,
        annotator: Annotator,
        postmortems: PostMortemWriter | None,
        clock: Callable[[], float],
    ) -> None:
        self._token = token
        self._max_body_bytes = max_body_bytes
        self._db = db
        self._runner = runner
        self._kinds_for = kinds_for
        self._audit = audit
        self.annotator = annotator
        self._postmortems = postmortems
        self._clock = clock

    def application(self) -> web.Application:
        """The aiohttp application serving the routes above."""
        app = web.Application(
            client_max_size=self._max_body_bytes, middlewares=[self._authenticate]
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
        return app

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
        limit = self._max_body_bytes
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
        kinds_for = self._kinds_for
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
        stored = await asyncio.to_thread(
            partial(audit.record, once=True),  # two approvals at once: one is recorded
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
        if stored is None:
            return _json_error(409, f"action {action_id} ({record.kind}) is approved already")
        log.info("action %d approved by %s", action_id, actor)
        return web.json_response({"action_id": action_id, "approved": True})

    async def _audit_log(self, request: web.Request) -> web.Response:
        """``GET /v1/audit[?limit=N]`` -> ``{"audit": [entry]}``, oldest first."""
        raw = request.query.get("limit", str(DEFAULT_LIST_LIMIT))
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST_LIMIT:
            return _json_error(400, f"limit: must be an integer 1..{MAX_LIST_LIMIT} (got {raw!r})")
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
            try:
                records = await self._db.run(lambda s: read(s, limit))
            except StoreError as exc:
                log.error("%s", exc)
                return _json_error(500, f"cannot read {name}")
            return web.json_response({name: [r.model_dump(mode="json") for r in records]})

        return handler


__all__ = ["ResponderApi"]
