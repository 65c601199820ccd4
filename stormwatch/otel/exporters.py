"""The span exporters of the OpenTelemetry set-up: the SDK's OTLP/HTTP one, JSON lines in a
file, and the counting wrapper every :class:`~stormwatch.otel.Tracing` exports through."""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from stormwatch.errors import ConfigError
from stormwatch.otel.settings import OTLP_PACKAGE

log = logging.getLogger(__name__)

_OTLP_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


def otlp_available() -> bool:
    """Whether the OTLP/HTTP exporter package is importable."""
    try:
        return importlib.util.find_spec(_OTLP_MODULE) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def otlp_exporter(url: str, timeout: float | None) -> SpanExporter:
    """The SDK's OTLP/HTTP exporter for ``url`` (``timeout`` s per export; None: the
    ``OTEL_EXPORTER_OTLP_*TIMEOUT`` variables or the SDK's 10 s).

    Raises:
        ConfigError: the exporter package is not installed (the message names it).
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigError(
            f"otlp_endpoint: the OTLP exporter is not installed; run `pip install {OTLP_PACKAGE}`"
            " (or leave the OTLP endpoint unset to write JSON lines)"
        ) from exc
    exporter: SpanExporter = OTLPSpanExporter(endpoint=url, timeout=timeout)
    return exporter


class JsonLinesSpanExporter(SpanExporter):
    """Appends each span as one JSON object per line (``ReadableSpan.to_json``) to ``path``.

    The file is opened per batch with ``O_APPEND`` and written with one ``write`` call, so
    a forked child and its parent never interleave lines.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = "".join(span.to_json(indent=None) + "\n" for span in spans).encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("cannot write spans to %s: %s", self.path, exc.strerror or exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release (the file is opened per batch)."""


class CountingExporter(SpanExporter):
    """Wraps the real exporter: counts what it accepted and refused; rebuilt after a fork."""

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

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def after_fork(self) -> None:
        """A fresh inner exporter: the parent's sockets are not ours to use."""
        self.inner = self._factory()
        self.lock = threading.Lock()
        self.exported = self.failed = 0


__all__ = ["CountingExporter", "JsonLinesSpanExporter", "otlp_available", "otlp_exporter"]
