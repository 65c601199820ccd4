"""OpenTelemetry trace of one experiment: a root ``experiment`` span, a child span per activity.

The journal links to it: ``Journal.trace_id`` and each record's ``span_id`` (hex, as
OTLP and Jaeger/Tempo show them). The set-up is the shared one (:mod:`stormwatch.otel`):
spans are exported over OTLP/HTTP to ``STORMWATCH_OTLP_ENDPOINT`` when set (``/v1/traces``
appended), else to the standard ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, otherwise as JSON
lines to ``<experiment-dir>/spans.jsonl``; each span is written as it ends. The provider is
the experiment's own (never the global one) and is flushed when the experiment ends.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from opentelemetry import trace
from opentelemetry.context import Context

from stormwatch.errors import ConfigError
from stormwatch.otel import Tracing, TracingOptions

logger = logging.getLogger(__name__)

#: Environment variable naming an OTLP/HTTP endpoint (as for the trainer and the agent).
OTLP_ENV = "STORMWATCH_OTLP_ENDPOINT"
#: Seconds the end of an experiment waits for its spans to be exported.
FLUSH_TIMEOUT_S = 3.0


class ExperimentTrace:
    """The experiment's tracer, its root span and the context activities are children of."""

    def __init__(self, experiment_id: str, title: str) -> None:
        endpoint = os.environ.get(OTLP_ENV)
        self._tracing = Tracing(
            TracingOptions(
                service_name="stormwatch-chaos",
                tracer_name="stormwatch.chaos",
                resource={"stormwatch.experiment_id": experiment_id},
                otlp_endpoint=endpoint or None,
                flush_timeout=FLUSH_TIMEOUT_S,
                processor="simple",
            ),
            deferred=True,
        )
        self.tracer = self._tracing.tracer
        self.root = self.tracer.start_span(
            "experiment", attributes={"experiment.id": experiment_id, "experiment.title": title}
        )
        self.context: Context = trace.set_span_in_context(self.root)

    @property
    def trace_id(self) -> str:
        return format(self.root.get_span_context().trace_id, "032x")

    def export_to(self, experiment_dir: Path) -> None:
        """Start exporting (once the experiment folder exists); spans so far are kept open.

        An OTLP endpoint whose exporter package is missing falls back to the file, with a
        warning (the experiment runs either way).
        """
        spans_file = experiment_dir / "spans.jsonl"
        try:
            self._tracing.export_to(spans_file)
        except ConfigError as exc:
            logger.warning("%s; writing spans to %s", exc, spans_file)
            self._tracing.export_to_file(spans_file)

    def end(self, status: str) -> None:
        """End the root span with the experiment's status and flush everything."""
        self.root.set_attribute("experiment.status", status)
        if status != "completed":
            self.root.set_status(trace.Status(trace.StatusCode.ERROR, status))
        self.root.end()
        self._tracing.shutdown()


def span_hex(span: trace.Span) -> str:
    """The span id in hex (16 digits)."""
    return format(span.get_span_context().span_id, "016x")


__all__ = ["OTLP_ENV", "ExperimentTrace", "span_hex"]
