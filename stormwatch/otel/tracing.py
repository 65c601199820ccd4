"""One process's tracer provider (:class:`Tracing`); see :mod:`stormwatch.otel`."""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

import stormwatch
from stormwatch.otel.exporters import CountingExporter, JsonLinesSpanExporter, otlp_exporter
from stormwatch.otel.settings import TracingOptions, build_resource, resolve_endpoint, sdk_disabled
from stormwatch.otel.timed import TimedSpan, TimedSpans

log = logging.getLogger(__name__)


class _EndCounter(SpanProcessor):
    """Counts spans that ended (the denominator of what was dropped)."""

    def __init__(self) -> None:
        self.ended = 0
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self.ended += 1


class Tracing:
    """One process's tracer provider and span exporter (see the module docstring).

    Args:
        options: what the component asks for.
        exporter: use this exporter instead of the configured destination (a seam for
            tests and embedders).
        deferred: build the provider now but attach the destination later with
            :meth:`export_to` (the chaos controller learns its folder after its first span).

    Raises:
        ConfigError: an OTLP destination without the exporter package, or an
            ``OTEL_EXPORTER_OTLP_*ENDPOINT`` that is not an http(s) URL.
    """

    def __init__(
        self,
        options: TracingOptions,
        *,
        exporter: SpanExporter | None = None,
        deferred: bool = False,
    ) -> None:
        self.options = options
        self.destination = "none"
        self.provider: TracerProvider | None = None
        self._exporter: CountingExporter | None = None
        self._ended = _EndCounter()
        self._closed = False
        self._pid = os.getpid()
        self.tracer: trace.Tracer = trace.NoOpTracer()
        self._processors: list[SpanProcessor] = []  # this provider's, for timed spans
        self._timed: TimedSpans | None = None
        if sdk_disabled():
            self.destination = "disabled (OTEL_SDK_DISABLED)"
            return
        endpoint = resolve_endpoint(options.otlp_endpoint)
        if exporter is None and not deferred and endpoint is None and options.spans_file is None:
            return  # nowhere to send spans: record none
        self.provider = TracerProvider(resource=build_resource(options), shutdown_on_exit=False)
        self._add_processor(self._ended)
        self.tracer = self.provider.get_tracer(options.tracer_name, stormwatch.__version__)
        self._timed = TimedSpans(
            self.provider,
            InstrumentationScope(options.tracer_name, stormwatch.__version__),
            self._processors,
        )
        self._register_lifecycle_hooks()
        if exporter is not None:
            self._attach(lambda: exporter, "the given exporter")
        elif not deferred:
            self.export_to(options.spans_file)

    # ---------------------------------------------------------------- public
    def timed_span(self, name: str, attributes: dict[str, Any]) -> TimedSpan | None:
        """A span for a hot loop (:mod:`stormwatch.otel.timed`: current while the ``with``
        block runs, built without the SDK's span object); ``None`` when spans are off."""
        timed = self._timed
        return None if timed is None else timed.span(name, dict(attributes))

    def export_to(self, spans_file: Path | None) -> None:
        """Start exporting: to the OTLP endpoint when one is configured, else as JSON lines
        to ``spans_file`` (spans that ended before are not exported).

        Raises:
            ConfigError: an OTLP destination without the exporter package.
        """
        if self.provider is None or self._exporter is not None:
            return
        endpoint = resolve_endpoint(self.options.otlp_endpoint)
        if endpoint is not None:
            env = os.environ
            timeout = (
                None
                if env.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
                or env.get("OTEL_EXPORTER_OTLP_TIMEOUT")
                else self.options.flush_timeout
            )
            otlp_exporter(endpoint, timeout)  # fail now, naming the package
            self._attach(lambda: otlp_exporter(endpoint, timeout), endpoint)
        elif spans_file is not None:
            self.export_to_file(spans_file)

    def export_to_file(self, spans_file: Path) -> None:
        """Start exporting as JSON lines to ``spans_file``, whatever endpoint is configured
        (a component's fallback when its OTLP destination cannot be used)."""
        if self.provider is None or self._exporter is not None:
            return
        path = Path(spans_file)
        self._attach(lambda: JsonLinesSpanExporter(path), str(path))

    def counts(self) -> dict[str, int]:
        """Spans ``ended``, ``exported`` and ``failed`` in this process so far."""
        exporter = self._exporter
        if exporter is None:
            return {"ended": self._ended.ended, "exported": 0, "failed": 0}
        with exporter.lock:
            return {
                "ended": self._ended.ended,
                "exported": exporter.exported,
                "failed": exporter.failed,
            }

    def flush(self, timeout: float | None = None) -> bool:
        """Export what is queued, waiting at most ``timeout`` s (default ``flush_timeout``).

        Returns False when the exporter did not finish in time (it keeps trying on a daemon
        thread that does not hold up the process's exit).
        """
        if self.provider is None:
            return True
        limit = self.options.flush_timeout if timeout is None else timeout
        return _bounded(self.provider.force_flush, limit, "flush")

    def shutdown(self, timeout: float | None = None) -> int:
        """Flush and stop within ``timeout`` s (default ``flush_timeout``); idempotent.

        Returns:
            The spans that ended but were not exported (logged as a warning when any).
        """
        provider = self.provider
        if provider is None or self._closed:
            return 0
        self._closed = True
        limit = self.options.flush_timeout if timeout is None else timeout
        done = _bounded(provider.shutdown, limit, "shutdown")
        counts = self.counts()
        dropped = max(counts["ended"] - counts["exported"], 0)
        if not done or dropped:
            log.warning(
                "tracing: %d of %d spans not exported to %s within %.1f s (exporter %s); "
                "going on without them",
                dropped,
                counts["ended"],
                self.destination,
                limit,
                "did not finish in time" if not done else "failed",
            )
        return dropped

    # --------------------------------------------------------------- private
    def _attach(self, factory: Callable[[], SpanExporter], destination: str) -> None:
        assert self.provider is not None
        self._exporter = exporter = CountingExporter(factory)
        self.destination = destination
        processor: SpanProcessor
        if self.options.processor == "simple":
            processor = SimpleSpanProcessor(exporter)
        else:
            env = os.environ
            delay = self.options.schedule_delay
            processor = BatchSpanProcessor(
                exporter,
                schedule_delay_millis=(
                    None if env.get("OTEL_BSP_SCHEDULE_DELAY") or delay is None else delay * 1000
                ),
                export_timeout_millis=(
                    None
                    if env.get("OTEL_BSP_EXPORT_TIMEOUT")
                    else self.options.flush_timeout * 1000
                ),
            )
        self._add_processor(processor)

    def _add_processor(self, processor: SpanProcessor) -> None:
        assert self.provider is not None
        self.provider.add_span_processor(processor)
        self._processors.append(processor)

    def _register_lifecycle_hooks(self) -> None:
        ref = weakref.ref(self)

        def after_in_child() -> None:
            me = ref()
            if me is not None:
                me._after_fork()

        os.register_at_fork(after_in_child=after_in_child)
        multiprocessing.util.register_after_fork(self, Tracing._after_multiprocessing_fork)
        atexit.register(_shutdown_at_exit, ref)

    def _after_fork(self) -> None:
        self._pid = os.getpid()
        self._ended.ended = 0
        if self._exporter is not None:
            self._exporter.after_fork()

    def _after_multiprocessing_fork(self) -> None:
        multiprocessing.util.Finalize(self, self._flush_at_child_exit, exitpriority=100)

    def _flush_at_child_exit(self) -> None:
        if os.getpid() == self._pid and not self._closed:
            self.flush()


def _shutdown_at_exit(ref: weakref.ref[Tracing]) -> None:
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


__all__ = ["Tracing"]
