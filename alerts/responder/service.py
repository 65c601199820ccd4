"""The responder: Alertmanager's webhook receiver, incident book and action runner.

:class:`Responder` builds the collaborators in order, each registered for cleanup as it is
made (``AsyncExitStack``): the playbook (with its Prometheus client and platform backend),
the store on its worker thread, the audit log and guards, the action runner, the
post-mortem writer, then the HTTP API (:mod:`stormwatch.alerts.responder.api`) on its
listener. Its settings are :class:`~stormwatch.alerts.responder.settings.ResponderSettings`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack

from aiohttp import web

from stormwatch.alerts.actions.playbook import Playbook, playbook_from_policy
from stormwatch.alerts.incident_report import PostMortemWriter, recovery_visible
from stormwatch.alerts.responder.action_runner import ActionRunner, StoreWorker
from stormwatch.alerts.responder.api import ResponderApi
from stormwatch.alerts.responder.audit import AuditLog
from stormwatch.alerts.responder.auth import read_token
from stormwatch.alerts.responder.crashpoints import CrashPoints
from stormwatch.alerts.responder.guards import Guardrails
from stormwatch.alerts.responder.settings import ResponderSettings
from stormwatch.alerts.responder.store import Store
from stormwatch.dashboards.annotations import Annotator
from stormwatch.errors import ConfigError

log = logging.getLogger(__name__)


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

    Raises:
        ConfigError: a bad test-only crash point (``STORMWATCH_RESPONDER_CRASH_AT``,
            :mod:`~stormwatch.alerts.responder.crashpoints`).

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
        self._crash = CrashPoints.from_env()
        self._stack = AsyncExitStack()
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
        playbook = self._playbook or await self._default_playbook()
        self._playbook = playbook
        db = StoreWorker(Store(settings.db_path))
        self._stack.callback(db.close)
        audit = AuditLog(settings.db_path, settings.audit_path)
        self._stack.callback(audit.close)
        guardrails = Guardrails(settings.policy, audit, clock=self._clock, crash=self._crash)
        self._stack.push_async_callback(asyncio.to_thread, self.annotator.close)
        runner = ActionRunner(
            db,
            playbook,
            clock=self._clock,
            guardrails=guardrails,
            annotator=self.annotator,
            crash=self._crash,
        )
        self._stack.push_async_callback(runner.aclose)
        postmortems = None
        if settings.postmortems:
            postmortems = PostMortemWriter(
                settings.write_postmortem,
                recovered=lambda pm: recovery_visible(pm, settings.lab_run_dir),
            )
            self._stack.push_async_callback(postmortems.aclose)
        api = ResponderApi(
            token=self._token,
            max_body_bytes=settings.max_body_bytes,
            db=db,
            runner=runner,
            kinds_for=playbook.kinds_for,
            audit=audit,
            annotator=self.annotator,
            postmortems=postmortems,
            clock=self._clock,
        )
        await self._listen(api.application())
        pending = await db.run(
            lambda s: s.recover(
                now=self._clock(), retry_safe=playbook.retry_safe, entry=guardrails.entry
            )
        )
        await asyncio.to_thread(audit.sync_mirror)  # the recovery's entries
        for action_id in pending:
            runner.submit(action_id)
        log.info("responder listening on %s (%d actions resumed)", self.url, len(pending))

    async def _default_playbook(self) -> Playbook:
        """The policy's playbook, with a Prometheus client when there is a URL."""
        settings = self.settings
        prometheus = None
        if settings.prometheus_url:
            prometheus = await self._stack.enter_async_context(settings.prometheus_client())
        return playbook_from_policy(
            settings.policy,
            prometheus=prometheus,
            backend=settings.backend(),
            confirm=settings.confirm,
        )

    async def _listen(self, app: web.Application) -> None:
        """Serve ``app`` on the configured address; sets :attr:`url`.

        Raises:
            ConfigError: the address cannot be bound (in use, not local).
        """
        settings = self.settings
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


__all__ = ["Responder", "serve"]
