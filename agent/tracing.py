"""The agent's own actions as OpenTelemetry spans (issue 4 item 8).

Spans are few by design: fault inject/revert (``fault.inject``,
``fault.revert``), a rank exit noticed by the watcher (``rank.exit``) and a
collector going down or recovering (``collector.failure``,
``collector.recovered``). Sampling cycles are not traced.

The set-up is the shared one (:mod:`stormwatch.otel`): export over OTLP/HTTP when an
endpoint is configured (``--otlp-endpoint``, else the standard
``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``), otherwise as JSON lines (one
``ReadableSpan.to_json()`` object per line) appended to ``--trace-file``; the other
``OTEL_*`` variables apply as described there.

Field cases (handled by :class:`stormwatch.otel.Tracing`):

* FC-07: nothing is set up at import time and no global provider is installed;
  :class:`AgentTracing` is built in :meth:`stormwatch.agent.Agent.start`. A
  forked child gets a fresh exporter, and a ``multiprocessing`` child flushes
  its spans before it exits. Any other forked helper calls
  :meth:`AgentTracing.flush` before ``os._exit``.
* FC-08: an exporter that never answers cannot hold the agent: every export has
  ``flush_timeout`` seconds, and :meth:`AgentTracing.shutdown` /
  :meth:`AgentTracing.flush` give up after ``flush_timeout`` (the flush runs on
  a daemon thread that is left behind), logging and counting what was dropped.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from urllib.parse import urlsplit

from stormwatch.agent.errors import AgentConfigError
from stormwatch.errors import ConfigError
from stormwatch.otel import Tracing, TracingOptions, traces_url

log = logging.getLogger(__name__)

#: Instrumentation scope of the agent's spans.
TRACER_NAME = "stormwatch.agent"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TracingSettings:
    """Where the agent's spans go.

    Attributes:
        node: node name (``service.instance.id`` and ``host.name`` resource attributes).
        trace_file: JSON-lines file, used when no OTLP endpoint is configured (neither
            ``otlp_endpoint`` nor ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``).
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
                    f"otlp_endpoint: expected http(s)://HOST:PORT[/PATH] "
                    f"(got {self.otlp_endpoint!r})"
                )
        if self.flush_timeout <= 0:
            raise AgentConfigError(f"trace_flush_timeout: must be > 0 s (got {self.flush_timeout})")

    @property
    def traces_url(self) -> str | None:
        """The OTLP traces URL (:func:`stormwatch.otel.traces_url`: the endpoint is a base
        URL, as ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
        return None if self.otlp_endpoint is None else traces_url(self.otlp_endpoint)


class AgentTracing(Tracing):
    """The agent's tracer provider, built after process start (FC-07), closed within a bound
    (FC-08); see :class:`stormwatch.otel.Tracing` for ``tracer``, ``counts``, ``flush``,
    ``shutdown`` and ``destination``.

    Args:
        settings: where spans go.

    Raises:
        AgentConfigError: OTLP requested without the exporter package, a bad
            ``OTEL_EXPORTER_OTLP_*ENDPOINT``, or the trace file's directory cannot be created.
    """

    def __init__(self, settings: TracingSettings) -> None:
        self.settings = settings
        if settings.trace_file is not None:
            try:
                settings.trace_file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise AgentConfigError(
                    f"trace_file: cannot create {settings.trace_file.parent}: {exc.strerror}"
                ) from exc
        options = TracingOptions(
            service_name="stormwatch-agent",
            tracer_name=TRACER_NAME,
            resource={"service.instance.id": settings.node, "host.name": settings.node},
            otlp_endpoint=settings.traces_url,
            spans_file=settings.trace_file,
            flush_timeout=settings.flush_timeout,
            schedule_delay=settings.schedule_delay,
        )
        try:
            super().__init__(options)
        except ConfigError as exc:
            raise AgentConfigError(str(exc)) from exc


__all__ = ["TRACER_NAME", "AgentTracing", "TracingSettings"]
