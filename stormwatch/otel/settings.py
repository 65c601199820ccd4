"""Settings of the OpenTelemetry set-up: what a component asks for (:class:`TracingOptions`) and
what the standard ``OTEL_*`` variables add (the destination, the protocol, the resource);
precedence as in :mod:`stormwatch.otel`."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.util.types import AttributeValue

import stormwatch
from stormwatch.errors import ConfigError
from stormwatch.urls import is_http_url

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


__all__ = [
    "OTLP_PACKAGE",
    "PROTOCOL",
    "TRACES_PATH",
    "TracingOptions",
    "build_resource",
    "check_protocol",
    "resolve_endpoint",
    "sdk_disabled",
    "traces_url",
]
