"""The one OpenTelemetry set-up: a tracer provider with one span exporter, for the agent,
the trainer and the chaos controller.

Each component names its spans (names, attributes) itself; what it shares is built here:
the resource, the sampler, the exporter (OTLP/HTTP from ``opentelemetry-exporter-otlp-proto-http``,
or JSON lines in a file), the span processor, counting what was exported, and a flush and
shutdown bounded in time.

Where a setting comes from (later wins): the component's default < the standard
``OTEL_*`` environment variable < an explicit component flag (``--otlp-endpoint``):

* ``OTEL_SDK_DISABLED=true``: no provider, no spans, nothing exported.
* ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``: over the component's defaults
  (semantic conventions: ``service.name`` ``stormwatch-agent``..., ``service.version``,
  ``service.namespace`` ``stormwatch``, ``host.name`` the machine's name, ``process.pid``);
  the attributes a component sets from its own flags (node, rank, experiment id) win over
  them. On Kubernetes the agent's DaemonSet puts ``k8s.pod.name``, ``k8s.namespace.name`` and
  ``k8s.node.name`` into ``OTEL_RESOURCE_ATTRIBUTES`` from the downward API.
* The destination: the component's OTLP endpoint flag; else
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (used as is); else ``OTEL_EXPORTER_OTLP_ENDPOINT``;
  else JSON lines in the component's spans file; else (no file) no spans. An endpoint flag
  (``--otlp-endpoint`` of the agent and the trainer, ``STORMWATCH_OTLP_ENDPOINT`` of the chaos
  controller) means what ``OTEL_EXPORTER_OTLP_ENDPOINT`` means, in every component: the
  collector's OTLP/HTTP base URL, to which ``/v1/traces`` is appended (a URL that already
  ends in ``/v1/traces`` is used as it is).
* ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``: ``http/protobuf`` (the default) is the one
  protocol of the installed exporter; ``grpc`` or ``http/json`` is a configuration error
  that says so, rather than spans sent in a protocol the collector's port does not speak.
* ``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS``, ``..._CERTIFICATE``, ``..._COMPRESSION``: read by
  the SDK's exporter. ``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT``: seconds per export (the
  Python SDK's unit); without it an export may take the component's ``flush_timeout``.
* ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``: read by the SDK (default: every span).
* ``OTEL_BSP_SCHEDULE_DELAY``, ``OTEL_BSP_EXPORT_TIMEOUT``, ``OTEL_BSP_MAX_QUEUE_SIZE``,
  ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``: the batch processor's; without them the component's
  schedule delay and ``flush_timeout`` apply, and the SDK's queue sizes.

Lifecycle (FC-07, FC-08): nothing happens at import time and no global provider is
installed; a :class:`Tracing` is built inside the process that records spans. A forked
child gets a fresh exporter (``os.register_at_fork``; the SDK's batch processor restarts its
own worker and empties its queue), and a ``multiprocessing`` child flushes before it exits
(``multiprocessing.util.Finalize``: such children leave through ``os._exit``). The provider
is built with ``shutdown_on_exit=False``: in opentelemetry-sdk 1.45 ``force_flush`` ignores
its timeout (open-telemetry/opentelemetry-python#4568) and the SDK's ``atexit`` shutdown
joins an exporter stuck in retries (#4043); :meth:`Tracing.flush` and
:meth:`Tracing.shutdown` run on a daemon thread joined for at most ``flush_timeout``
seconds, and spans not exported by then are counted and logged as dropped.

The JSON-lines format is one ``ReadableSpan.to_json(indent=None)`` object per line (what
the post-mortems and the tests read).
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import multiprocessing.util
import os
import socket
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.util.types import AttributeValue

import stormwatch
from stormwatch.errors import ConfigError
from stormwatch.urls import is_http_url

log = logging.getLogger(__name__)

#: pip package providing the OTLP/HTTP span exporter.
OTLP_PACKAGE = "opentelemetry-exporter-otlp-proto-http"
_OTLP_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
#: Path of the traces endpoint under an OTLP/HTTP base URL (OTLP specification).
TRACES_PATH = "/v1/traces"


#: What the installed exporter speaks (OTEL_EXPORTER_OTLP_PROTOCOL's value for OTLP/HTTP).
PROTOCOL = "http/protobuf"


def traces_url(endpoint: str) -> str:
    """The traces URL under an OTLP/HTTP base URL (``OTEL_EXPORTER_OTLP_ENDPOINT``'s
    meaning): ``/v1/traces`` appended, unless ``endpoint`` ends with it already."""
    if urlsplit(endpoint).path.rstrip("/").endswith(TRACES_PATH):
        return endpoint
    return endpoint.rstrip("/") + TRACES_PATH


def check_protocol(environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` when ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` asks for a
    protocol other than ``http/protobuf`` (the traces variable wins, as in the SDK)."""
    env = os.environ if environ is None else environ
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(name, "").strip()
        if not value:
            continue
        if value != PROTOCOL:
            raise ConfigError(
                f"{name}: {value!r} is not supported: stormwatch exports OTLP over HTTP "
                f"({PROTOCOL}); unset it or set {PROTOCOL}, and point the endpoint at the "
                "collector's OTLP/HTTP port (4318)"
            )
        return


def otlp_available() -> bool:
    """Whether the OTLP/HTTP exporter package is importable."""
    try:
        return importlib.util.find_spec(_OTLP_MODULE) is not None
    except (ModuleNotFoundError, ValueError):
        return False


@dataclass(frozen=True, kw_only=True)
class TracingOptions:
    """What a component asks of the set-up (see the module docstring for precedence).

    Attributes:
        service_name: default ``service.name`` (``OTEL_SERVICE_NAME`` wins over it).
        tracer_name: instrumentation scope of the component's spans.
        resource: resource attributes from the component's own flags (node, rank, ...);
            they win over ``OTEL_RESOURCE_ATTRIBUTES``.
        otlp_endpoint: OTLP/HTTP traces URL given explicitly (a flag); wins over
            ``OTEL_EXPORTER_OTLP_*ENDPOINT``.
        spans_file: JSON-lines file used when no OTLP endpoint is configured; None and no
            endpoint: spans are not recorded at all.
        flush_timeout: seconds a flush or the shutdown may take, and an export when
            ``OTEL_EXPORTER_OTLP_TIMEOUT`` / ``OTEL_BSP_EXPORT_TIMEOUT`` are unset.
        schedule_delay: seconds between batch exports when ``OTEL_BSP_SCHEDULE_DELAY`` is
            unset (None: the SDK's 5 s).
        processor: ``batch`` (a worker thread exports) or ``simple`` (each span exported
            as it ends, on the caller's thread).
    """

    service_name: str
    tracer_name: str
    resource: Mapping[str, AttributeValue] = field(default_factory=dict)
    otlp_endpoint: str | None = None
    spans_file: Path | None = None
    flush_timeout: float = 3.0
    schedule_delay: float | None = None
    processor: Literal["batch", "simple"] = "batch"

    def __post_init__(self) -> None:
        if not self.flush_timeout > 0:
            raise ConfigError(f"trace_flush_timeout: must be > 0 s (got {self.flush_timeout})")


def sdk_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """``OTEL_SDK_DISABLED`` is ``true`` (any case)."""
    env = os.environ if environ is None else environ
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def resolve_endpoint(explicit: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The OTLP traces URL: ``explicit`` (a base URL, as ``OTEL_EXPORTER_OTLP_ENDPOINT``),
    else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is, else ``OTEL_EXPORTER_OTLP_ENDPOINT``
    (both through :func:`traces_url`), else None.

    Raises:
        ConfigError: the variable in use is not an http(s) URL (the message names it), or
            an OTLP protocol other than ``http/protobuf`` is asked for.
    """
    env = os.environ if environ is None else environ
    if explicit:
        check_protocol(env)
        return traces_url(explicit)
    for name, url in (
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", env.get("OTEL_EXPORTER_OTLP_ENDPOINT")),
    ):
        if not url:
            continue
        if not is_http_url(url):
            raise ConfigError(f"{name}: expected http(s)://HOST:PORT[/PATH] (got {url!r})")
        check_protocol(env)
        if name == "OTEL_EXPORTER_OTLP_ENDPOINT":
            return traces_url(url)
        return url
    return None


def build_resource(options: TracingOptions) -> Resource:
    """Defaults < ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME`` < ``options.resource``."""
    defaults: dict[str, AttributeValue] = {
        "service.name": options.service_name,
        "service.namespace": "stormwatch",
        "service.version": stormwatch.__version__,
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
    }
    from_env = dict(OTELResourceDetector().detect().attributes)
    return Resource.create({**defaults, **from_env, **options.resource})


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


class _CountingExporter(SpanExporter):
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
        self._exporter: _CountingExporter | None = None
        self._ended = _EndCounter()
        self._closed = False
        self._pid = os.getpid()
        self.tracer: trace.Tracer = trace.NoOpTracer()
        if sdk_disabled():
            self.destination = "disabled (OTEL_SDK_DISABLED)"
            return
        endpoint = resolve_endpoint(options.otlp_endpoint)
        if exporter is None and not deferred and endpoint is None and options.spans_file is None:
            return  # nowhere to send spans: record none
        self.provider = TracerProvider(resource=build_resource(options), shutdown_on_exit=False)
        self.provider.add_span_processor(self._ended)
        self.tracer = self.provider.get_tracer(options.tracer_name, stormwatch.__version__)
        self._register_lifecycle_hooks()
        if exporter is not None:
            self._attach(lambda: exporter, "the given exporter")
        elif not deferred:
            self.export_to(options.spans_file)

    # ---------------------------------------------------------------- public
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
        self._exporter = exporter = _CountingExporter(factory)
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
        self.provider.add_span_processor(processor)

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


__all__ = [
    "OTLP_PACKAGE",
    "PROTOCOL",
    "TRACES_PATH",
    "JsonLinesSpanExporter",
    "Tracing",
    "TracingOptions",
    "build_resource",
    "check_protocol",
    "otlp_available",
    "otlp_exporter",
    "resolve_endpoint",
    "sdk_disabled",
    "traces_url",
]
