"""OpenTelemetry trace of one experiment: a root ``experiment`` span, a child span per activity.

The journal links to it: ``Journal.trace_id`` and each record's ``span_id`` (hex, as
OTLP and Jaeger/Tempo show them). Spans are exported over OTLP/HTTP to
``STORMWATCH_OTLP_ENDPOINT`` when set (needs ``opentelemetry-exporter-otlp-proto-http``),
otherwise as JSON lines to ``<experiment-dir>/spans.jsonl``. The provider is the
experiment's own (never the global one) and is flushed when the experiment ends.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

logger = logging.getLogger(__name__)

#: Environment variable naming an OTLP/HTTP endpoint (as for the trainer and the agent).
OTLP_ENV = "STORMWATCH_OTLP_ENDPOINT"


class JsonLinesExporter(SpanExporter):
    """Appends each finished span as one JSON line (``ReadableSpan.to_json``) to ``path``."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            with self._lock, self._path.open("a", encoding="utf-8") as fh:
                for span in spans:
                    fh.write(json.dumps(json.loads(span.to_json())) + "\n")
        except OSError as exc:
            logger.warning("could not write spans to %s: %s", self._path, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _exporter(experiment_dir: Path) -> SpanExporter:
    endpoint = os.environ.get(OTLP_ENV)
    if endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            logger.warning(
                "%s is set but opentelemetry-exporter-otlp-proto-http is not installed; "
                "writing spans to %s/spans.jsonl",
                OTLP_ENV,
                experiment_dir,
            )
        else:
            return OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")
    return JsonLinesExporter(experiment_dir / "spans.jsonl")


class ExperimentTrace:
    """The experiment's tracer, its root span and the context activities are children of."""

    def __init__(self, experiment_id: str, title: str) -> None:
        self._provider = TracerProvider(
            resource=Resource.create(
                {"service.name": "stormwatch-chaos", "stormwatch.experiment_id": experiment_id}
            )
        )
        self.tracer = self._provider.get_tracer("stormwatch.chaos")
        self.root = self.tracer.start_span(
            "experiment", attributes={"experiment.id": experiment_id, "experiment.title": title}
        )
        self.context: Context = trace.set_span_in_context(self.root)

    @property
    def trace_id(self) -> str:
        return format(self.root.get_span_context().trace_id, "032x")

    def export_to(self, experiment_dir: Path) -> None:
        """Start exporting (once the experiment folder exists); spans so far are kept open."""
        self._provider.add_span_processor(SimpleSpanProcessor(_exporter(experiment_dir)))

    def end(self, status: str) -> None:
        """End the root span with the experiment's status and flush everything."""
        self.root.set_attribute("experiment.status", status)
        if status != "completed":
            self.root.set_status(trace.Status(trace.StatusCode.ERROR, status))
        self.root.end()
        self._provider.force_flush(timeout_millis=3000)
        self._provider.shutdown()


def span_hex(span: trace.Span) -> str:
    """The span id in hex (16 digits)."""
    return format(span.get_span_context().span_id, "016x")


__all__ = ["OTLP_ENV", "ExperimentTrace", "JsonLinesExporter", "span_hex"]
