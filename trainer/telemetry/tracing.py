"""OpenTelemetry spans of one rank: step, forward, backward, optimizer, checkpoint save / load.

Export: through OTLP/HTTP when an endpoint is configured (``--otlp-endpoint``;
needs the pip package ``opentelemetry-exporter-otlp-proto-http``, which the
CLI checks before anything starts), otherwise as JSON lines (one span per
line, the SDK's ``ReadableSpan.to_json``) to ``<spans-dir>/rank<R>.jsonl``
(``--spans-dir``, default ``<log-dir>/spans``). With neither, spans are
no-ops.

Lifecycle (FC-07, FC-08):

* The provider is created by :class:`RankTracing` inside the rank process
  (torchrun execs its workers), never at import time, and it is not made the
  global provider. Should the process fork, the SDK's batch processor
  restarts its worker in the child (``os.register_at_fork``); spans still
  only leave a process through :meth:`RankTracing.close`.
* :meth:`RankTracing.close` flushes with a bound: the provider's shutdown
  (which exports what is queued) runs in a daemon thread that is joined for
  at most ``flush_timeout`` seconds. In opentelemetry-sdk 1.45
  ``force_flush`` ignores its timeout (open-telemetry/opentelemetry-python#4568)
  and the ``atexit`` shutdown joins an exporter stuck in retries (#4043), so
  the provider is built with ``shutdown_on_exit=False`` and neither is
  called on the exit path. Spans not exported by then are counted as
  dropped (:attr:`RankTracing.dropped`) and logged; the process exits anyway.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import IO, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)

from stormwatch.errors import ConfigError
from stormwatch.trainer.config import TracingConfig

log = logging.getLogger(__name__)

#: pip package that provides the OTLP/HTTP span exporter.
OTLP_PACKAGE = "opentelemetry-exporter-otlp-proto-http"
_OTLP_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


def check_otlp_available() -> None:
    """Raise :class:`ConfigError` naming the pip package when the OTLP exporter is missing."""
    try:
        found = importlib.util.find_spec(_OTLP_MODULE) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise ConfigError(
            f"otlp_endpoint: exporting spans over OTLP needs the package {OTLP_PACKAGE} "
            f"(pip install {OTLP_PACKAGE}), or leave --otlp-endpoint unset to write JSON lines"
        )


class _Counting(SpanProcessor):
    """Counts spans that ended (the denominator of :attr:`RankTracing.dropped`)."""

    def __init__(self) -> None:
        self.ended = 0
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self.ended += 1


class _CountingExporter(SpanExporter):
    """Delegates to ``inner`` and counts the spans it accepted."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _otlp_exporter(endpoint: str, timeout: float) -> SpanExporter:
    check_otlp_available()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint, timeout=timeout)


class RankTracing:
    """One rank's tracer provider and exporter (see module docstring).

    Args:
        config: destinations and flush bound.
        rank: global rank (``rank`` resource attribute, file name).
        attributes: further resource attributes (``job``, ``attempt``, ...).
        exporter: use this exporter instead of the configured one (a seam for
            tests and embedders).

    Raises:
        ConfigError: an OTLP endpoint is configured but the exporter package is missing.
        OSError: the spans folder cannot be created.
    """

    def __init__(
        self,
        config: TracingConfig,
        *,
        rank: int,
        attributes: dict[str, Any] | None = None,
        exporter: SpanExporter | None = None,
    ) -> None:
        self._config = config
        self._file: IO[str] | None = None
        self._provider: TracerProvider | None = None
        self._exporter: _CountingExporter | None = None
        self._counting = _Counting()
        self.dropped = 0
        if exporter is None and config.otlp_endpoint is not None:
            exporter = _otlp_exporter(config.otlp_endpoint, config.flush_timeout)
        elif exporter is None and config.spans_dir is not None:
            config.spans_dir.mkdir(parents=True, exist_ok=True)
            self._file = (config.spans_dir / f"rank{rank}.jsonl").open("a", encoding="utf-8")
            exporter = ConsoleSpanExporter(
                out=self._file, formatter=lambda span: span.to_json(indent=None) + "\n"
            )
        if exporter is None:
            self.tracer: trace.Tracer = trace.NoOpTracer()
            return
        resource = Resource.create(
            {"service.name": "stormwatch-trainer", "rank": rank, **(attributes or {})}
        )
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self._exporter = _CountingExporter(exporter)
        self._provider.add_span_processor(self._counting)
        self._provider.add_span_processor(BatchSpanProcessor(self._exporter))
        self.tracer = self._provider.get_tracer("stormwatch.trainer")

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[None]:
        """A span named ``name`` around the block (nested spans become children)."""
        with self.tracer.start_as_current_span(name, attributes=attributes):
            yield

    def close(self) -> int:
        """Export what is queued within ``flush_timeout`` seconds; returns the spans dropped."""
        provider = self._provider
        if provider is None:
            return 0
        self._provider = None
        worker = threading.Thread(
            target=provider.shutdown, name="stormwatch-trace-shutdown", daemon=True
        )
        worker.start()
        worker.join(self._config.flush_timeout)
        assert self._exporter is not None
        self.dropped = max(self._counting.ended - self._exporter.exported, 0)
        if worker.is_alive() or self.dropped:
            log.warning(
                "tracing: %d of %d spans not exported within %.1f s (exporter unreachable?); "
                "exiting without them",
                self.dropped,
                self._counting.ended,
                self._config.flush_timeout,
            )
        if self._file is not None and not worker.is_alive():
            self._file.close()
        return self.dropped


__all__ = ["OTLP_PACKAGE", "RankTracing", "check_otlp_available"]
