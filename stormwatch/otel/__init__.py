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

from stormwatch.otel.exporters import JsonLinesSpanExporter, otlp_available, otlp_exporter
from stormwatch.otel.settings import (
    OTLP_PACKAGE,
    PROTOCOL,
    TRACES_PATH,
    TracingOptions,
    build_resource,
    check_protocol,
    resolve_endpoint,
    sdk_disabled,
    traces_url,
)
from stormwatch.otel.tracing import Tracing

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
