"""Grafana annotations for chaos and responder events, posted in the background.

:class:`Annotator` posts ``POST /api/annotations`` (Grafana's annotations HTTP API:
``time``/``timeEnd`` in Unix milliseconds, ``tags``, ``text``, optional
``dashboardUID``) through :class:`~stormwatch.clients.GrafanaClient` on one daemon thread
(with its own event loop). :meth:`Annotator.annotate`
only enqueues, so the caller is never blocked and never sees an error: a failed post
is logged and counted (:attr:`Annotator.failed`), a full queue drops the annotation
(:attr:`Annotator.dropped`). :meth:`Annotator.close` waits at most
:attr:`AnnotationSettings.timeout` seconds for what is queued.

Configuration (:meth:`AnnotationSettings.from_env`): ``STORMWATCH_GRAFANA_URL`` and
``GRAFANA_TOKEN`` (a service-account token, role Editor); without a URL annotations
are off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stormwatch.clients.grafana import GrafanaClient
from stormwatch.errors import ConfigError
from stormwatch.urls import is_http_url

log = logging.getLogger(__name__)

#: Environment variable with Grafana's base URL; unset or empty turns annotations off.
URL_ENV = "STORMWATCH_GRAFANA_URL"
#: Environment variable with the service-account token (the same one ``dashboards push`` uses).
TOKEN_ENV = "GRAFANA_TOKEN"


@dataclass(frozen=True, kw_only=True)
class AnnotationSettings:
    """Where annotations go.

    Attributes:
        url: Grafana's base URL (``http://host:3000``).
        token: service-account token, sent as ``Authorization: Bearer``.
        timeout: seconds one post may take, and the longest :meth:`Annotator.close` waits
            (default 2 s).
        dashboard_uid: attach annotations to this dashboard; None makes them
            organization-wide (shown by any dashboard's "Annotations & Alerts" query).
        max_pending: annotations queued at most; more are dropped (default 1000).
    """

    url: str
    token: str
    timeout: float = 2.0
    dashboard_uid: str | None = None
    max_pending: int = 1000

    def __post_init__(self) -> None:
        if not is_http_url(self.url):
            raise ConfigError(
                f"{URL_ENV}: {self.url!r} is not an http(s) URL; set e.g. http://127.0.0.1:3000"
            )
        if not self.token:
            raise ConfigError(
                f"{TOKEN_ENV}: empty; set it to a Grafana service-account token (role Editor)"
            )
        if not 0 < self.timeout <= 60:
            raise ConfigError(f"timeout: must be in (0, 60] seconds (got {self.timeout})")
        if self.max_pending < 1:
            raise ConfigError(f"max_pending: must be >= 1 (got {self.max_pending})")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AnnotationSettings | None:
        """Settings from ``STORMWATCH_GRAFANA_URL`` and ``GRAFANA_TOKEN``; None when no URL.

        Raises:
            ConfigError: a URL is set but is not http(s), or ``GRAFANA_TOKEN`` is missing.
        """
        env = os.environ if environ is None else environ
        url = env.get(URL_ENV, "").strip()
        if not url:
            return None
        return cls(url=url.rstrip("/"), token=env.get(TOKEN_ENV, "").strip())


@dataclass(frozen=True)
class _Annotation:
    text: str
    tags: tuple[str, ...]
    time_ms: int
    time_end_ms: int | None


_STOP = object()


class Annotator:
    """Posts annotations to Grafana in the background; a no-op without settings.

    Args:
        settings: where to post; None (annotations off) makes every call a no-op.

    Attributes:
        sent: annotations Grafana accepted.
        failed: posts that failed (refused, timed out, unreachable); each is logged.
        dropped: annotations not posted because the queue was full or closed.
    """

    def __init__(self, settings: AnnotationSettings | None) -> None:
        self.settings = settings
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self._queue: queue.Queue[object] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._abandoned = False
        if settings is not None:
            self._queue = queue.Queue(maxsize=settings.max_pending)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Annotator:
        """An annotator configured by :meth:`AnnotationSettings.from_env` (off without a URL)."""
        return cls(AnnotationSettings.from_env(environ))

    @property
    def enabled(self) -> bool:
        return self.settings is not None

    def annotate(
        self,
        text: str,
        tags: Sequence[str],
        *,
        start: float | None = None,
        end: float | None = None,
    ) -> None:
        """Queue one annotation; returns at once and never raises.

        Args:
            text: what happened (shown on hover).
            tags: Grafana tags (e.g. ``["stormwatch", "chaos", "fault-injected"]``).
            start: Unix time in seconds (default now).
            end: Unix time in seconds for a region; None for a point.
        """
        if self._queue is None:
            return
        if self._closed:
            self.dropped += 1
            return
        at = time.time() if start is None else start
        item = _Annotation(
            text=text,
            tags=tuple(tags),
            time_ms=int(at * 1000),
            time_end_ms=None if end is None else int(end * 1000),
        )
        if self._thread is None:  # started with the first annotation
            self._thread = threading.Thread(
                target=self._work, name="grafana-annotations", daemon=True
            )
            self._thread.start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            log.warning("Grafana annotation dropped (queue full): %s", text)

    def close(self) -> None:
        """Stop accepting annotations; wait at most ``settings.timeout`` s for queued ones.

        What is still queued after that is dropped (the thread is a daemon). Idempotent.
        """
        if self._queue is None or self._closed:
            return
        assert self.settings is not None
        self._closed = True
        if self._thread is None:
            return
        deadline = time.monotonic() + self.settings.timeout
        # Full: the worker is stuck on a post; the join below gives up and counts the drops.
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=self.settings.timeout)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._abandoned = True  # the worker stops after the post in flight
            left = sum(1 for item in _drain(self._queue) if item is not _STOP)
            self.dropped += left
            log.warning(
                "Grafana at %s still busy; %d annotation(s) dropped", self.settings.url, left
            )

    def _work(self) -> None:
        assert self.settings is not None and self._queue is not None
        settings = self.settings
        loop = asyncio.new_event_loop()
        api = GrafanaClient(settings.url, token=settings.token, timeout=settings.timeout)
        try:
            loop.run_until_complete(api.__aenter__())
            while True:
                item = self._queue.get()
                if item is _STOP or self._abandoned:
                    return
                assert isinstance(item, _Annotation)
                loop.run_until_complete(self._post(api, item))
        finally:
            loop.run_until_complete(api.aclose())
            loop.close()

    async def _post(self, api: GrafanaClient, item: _Annotation) -> None:
        assert self.settings is not None
        body: dict[str, Any] = {
            "time": item.time_ms,
            "timeEnd": item.time_end_ms if item.time_end_ms is not None else item.time_ms,
            "tags": list(item.tags),
            "text": item.text,
        }
        if self.settings.dashboard_uid:
            body["dashboardUID"] = self.settings.dashboard_uid
        try:
            await api.add_annotation(body)
        except Exception as exc:  # never fail the caller: refused, timed out, unreachable
            self.failed += 1
            # The first failure and every 100th are warnings; a Grafana that is down
            # must not flood the caller's log.
            level = logging.WARNING if self.failed % 100 == 1 else logging.DEBUG
            log.log(
                level,
                "cannot post Grafana annotation to %s (%d failed so far): %s",
                self.settings.url,
                self.failed,
                exc,
            )
        else:
            self.sent += 1


def _drain(items: queue.Queue[object]) -> list[object]:
    drained = []
    while True:
        try:
            drained.append(items.get_nowait())
        except queue.Empty:
            return drained


__all__ = ["TOKEN_ENV", "URL_ENV", "AnnotationSettings", "Annotator"]
