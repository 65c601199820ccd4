"""The agent's own actions as OpenTelemetry spans (issue 4 item 8).

Spans are few by design: fault inject/revert (``fault.inject``,
``fault.revert``), a rank exit noticed by the watcher (``rank.exit``) and a
collector going down or recovering (``collector.failure``,
``collector.recovered``). Sampling cycles are not traced.

Export: over OTLP/HTTP when an endpoint is configured (needs the
``opentelemetry-exporter-otlp-proto-http`` package), otherwise as JSON lines
(one ``ReadableSpan.to_json()`` object per line) appended to a file.

Field cases:

* FC-07: nothing is set up at import time and no global provider is installed;
  :class:`AgentTracing` is built in :meth:`stormwatch.agent.Agent.start`. A
  forked child gets a fresh exporter (``os.register_at_fork``; the SDK's batch
  processor restarts its own worker), and a ``multiprocessing`` child flushes
  its spans before it exits (a ``multiprocessing.util.Finalize`` hook: such
  children leave through ``os._exit``, which skips ``atexit``). Any other
  forked helper calls :meth:`AgentTracing.flush` before ``os._exit``.
* FC-08: an exporter that never answers cannot hold the agent: every export has
  ``flush_timeout`` seconds, and :meth:`AgentTracing.shutdown` /
  :meth:`AgentTracing.flush` give up after ``flush_timeout`` (the flush runs on
  a daemon thread that is left behind), logging and counting what was dropped.
  The provider has ``shutdown_on_exit=False``: no unbounded ``atexit`` join.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing.util
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import stormwatch
from stormwatch.agent.errors import AgentConfigError

log = logging.getLogger(__name__)

#: pip package providing the OTLP/HTTP span exporter.
OTLP_PACKAGE = "opentelemetry-exporter-otlp-proto-http"
#: Instrumentation scope of the agent's spans.
TRACER_NAME = "stormwatch.agent"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TracingSettings:
    """Where the agent's spans go.

    Attributes:
        node: node name (``service.instance.id`` and ``host.name`` resource attributes).
        trace_file: JSON-lines file, used when ``otlp_endpoint`` is None.
        otlp_endpoint: OTLP/HTTP URL (``http://collector:4318``; ``/v1/traces``
            is appended when the URL has no path).
        flush_timeout: seconds an export, a flush or the shutdown may take
            (3 s: a SIGTERM'd agent must restart quickly, FC-08).
        schedule_delay: seconds between batch exports (1 s: spans are rare and a
            post-mortem wants them on disk soon).
    """

    node: str
    trace_file: Path | None = None
    otlp_endpoint: str | None = None
    flush_timeout: float = 3.0
    schedule_delay: float = 1.0

    def __post_init__(self) -> None:
        if self.otlp_endpoint is None and self.trace_file is None:
            raise AgentConfigError("tracing: give trace_file or otlp_endpoint")
        if self.otlp_endpoint is not None:
            parts = urlsplit(self.otlp_endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise AgentConfigError(
                    f"otlp_endpoint: expected http(s)://HOST:PORT[/v1/traces] "
                    f"(got {self.otlp_endpoint!r})"
                )
        if self.flush_timeout <= 0:
            raise AgentConfigError(f"trace_flush_timeout: must be > 0 s (got {self.flush_timeout})")

    @property
    def traces_url(self) -> str | None:
        """The OTLP traces URL, ``/v1/traces`` added when the endpoint has no path."""
        if self.otlp_endpoint is None:
            return None
        if urlsplit(self.otlp_endpoint).path in ("", "/"):
            return self.otlp_endpoint.rstrip("/") + "/v1/traces"
        return self.otlp_endpoint


class JsonLinesSpanExporter(SpanExporter):
    """Appends each span as one JSON object per line to ``path``.

    The file is opened per batch with ``O_APPEND`` and written with one
    ``write`` call, so a forked child and its parent never interleave lines.
    """

    def __init__(self, path: Path) -> None:
        self._path = Path(path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = "".join(span.to_json(indent=None) + "\n" for span in spans).encode()
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("cannot write spans to %s: %s", self._path, exc.strerror)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release (the file is opened per batch)."""


def otlp_exporter(url: str, timeout: float) -> SpanExporter:
    """An OTLP/HTTP span exporter for ``url`` with a ``timeout`` (seconds) per export.

    Raises:
        AgentConfigError: the exporter package is not installed (names it).
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise AgentConfigError(
            f"otlp_endpoint: the OTLP exporter is not installed; run "
            f"`pip install {OTLP_PACKAGE}` (or use --trace-file)"
        ) from exc
    exporter: SpanExporter = OTLPSpanExporter(endpoint=url, timeout=timeout)
    return exporter


class _Counting(SpanExporter):
    """Wraps the real exporter: counts results; rebuilt after a fork (FC-07)."""

    def __init__(self, factory: Callable[[], SpanExporter]) -> None:
        self._factory = factory
        self.inner = factory()
        self.lock = threading.Lock()
        self.exported = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter bug must not reach the batch worker
            log.warning("span export raised", exc_info=True)
            result = SpanExportResult.FAILURE
        with self.lock:
            if result is SpanExportResult.SUCCESS:
                self.exported += len(spans)
            else:
                self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def after_fork(self) -> None:
        """A fresh inner exporter: the parent's sockets are not ours to use."""
        self.inner = self._factory()
        self.lock = threading.Lock()
        self.exported = self.failed = 0


class _EndCounter(SpanProcessor):
    def __init__(self) -> None:
        self.ended = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1


class AgentTracing:
    """The agent's tracer provider, built after process start (FC-07), closed within a bound (FC-08).

    Args:
        settings: where spans go.

    Raises:
        AgentConfigError: OTLP requested without the exporter package, or the
            trace file's directory cannot be created.
    """

    def __init__(self, settings: TracingSettings) -> None:
        self.settings = settings
        url = settings.traces_url
        if url is not None:
            otlp_exporter(url, settings.flush_timeout)  # fail now, with the package name
            factory: Callable[[], SpanExporter] = lambda: otlp_exporter(  # noqa: E731
                url, settings.flush_timeout
            )
            self.destination = url
        else:
            assert settings.trace_file is not None
            path = settings.trace_file
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise AgentConfigError(
                    f"trace_file: cannot create {path.parent}: {exc.strerror}"
                ) from exc
            factory = lambda: JsonLinesSpanExporter(path)  # noqa: E731
            self.destination = str(path)
        self._exporter = _Counting(factory)
        self._ended = _EndCounter()
        resource = Resource.create(
            {
                "service.name": "stormwatch-agent",
                "service.version": stormwatch.__version__,
                "service.instance.id": settings.node,
                "host.name": settings.node,
            }
        )
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.provider.add_span_processor(self._ended)
        self.provider.add_span_processor(
            BatchSpanProcessor(
                self._exporter,
                schedule_delay_millis=settings.schedule_delay * 1000,
                export_timeout_millis=settings.flush_timeout * 1000,
            )
        )
        self.tracer: trace.Tracer = self.provider.get_tracer(TRACER_NAME, stormwatch.__version__)
        self._closed = False
        self._pid = os.getpid()
        ref = weakref.ref(self)

        def after_in_child() -> None:
            me = ref()
            if me is not None:
                me._after_fork()

        os.register_at_fork(after_in_child=after_in_child)
        multiprocessing.util.register_after_fork(self, AgentTracing._after_multiprocessing_fork)
        atexit.register(_close_at_exit, ref)

    # ---------------------------------------------------------------- public
    def counts(self) -> dict[str, int]:
        """Spans ``ended``, ``exported`` and ``failed`` in this process so far."""
        with self._exporter.lock:
            return {
                "ended": self._ended.ended,
                "exported": self._exporter.exported,
                "failed": self._exporter.failed,
            }

    def flush(self, timeout: float | None = None) -> bool:
        """Export what is queued, waiting at most ``timeout`` s (default ``flush_timeout``).

        Returns False when the exporter did not finish in time (it keeps trying
        on a daemon thread that does not hold up the process's exit).
        """
        limit = self.settings.flush_timeout if timeout is None else timeout
        return _bounded(self.provider.force_flush, limit, "flush")

    def shutdown(self, timeout: float | None = None) -> None:
        """Flush and stop within ``timeout`` s (default ``flush_timeout``); idempotent."""
        if self._closed:
            return
        self._closed = True
        limit = self.settings.flush_timeout if timeout is None else timeout
        done = _bounded(self.provider.shutdown, limit, "shutdown")
        counts = self.counts()
        dropped = counts["ended"] - counts["exported"]
        if not done or dropped:
            log.warning(
                "tracing: %d of %d spans not exported to %s (exporter %s)",
                dropped,
                counts["ended"],
                self.destination,
                "did not finish in time" if not done else "failed",
            )

    # --------------------------------------------------------------- private
    def _after_fork(self) -> None:
        self._pid = os.getpid()
        self._ended.ended = 0
        self._exporter.after_fork()

    def _after_multiprocessing_fork(self) -> None:
        multiprocessing.util.Finalize(self, self._flush_at_child_exit, exitpriority=100)

    def _flush_at_child_exit(self) -> None:
        if os.getpid() == self._pid and not self._closed:
            self.flush()


def _close_at_exit(ref: weakref.ref[AgentTracing]) -> None:
    me = ref()
    if me is not None:
        me.shutdown()


def _bounded(fn: Callable[[], Any], timeout: float, what: str) -> bool:
    """Run ``fn`` on a daemon thread; True when it returned within ``timeout`` seconds."""
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        except Exception:
            log.warning("tracing %s failed", what, exc_info=True)
        finally:
            done.set()

    threading.Thread(target=run, name=f"stormwatch-trace-{what}", daemon=True).start()
    return done.wait(timeout)


__all__ = [
    "OTLP_PACKAGE",
    "TRACER_NAME",
    "AgentTracing",
    "JsonLinesSpanExporter",
    "TracingSettings",
    "otlp_exporter",
]
