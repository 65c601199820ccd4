"""The one OpenTelemetry set-up honours the standard OTEL_* variables, under the components'
explicit flags: defaults < environment < flags."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from stormwatch.agent.tracing import AgentTracing, TracingSettings
from stormwatch.chaos.execution.tracing import ExperimentTrace
from stormwatch.errors import ConfigError
from stormwatch.otel import OTLP_PACKAGE, Tracing, TracingOptions, resolve_endpoint
from stormwatch.telemetry.tracing import RankTracing
from stormwatch.trainer.config import TracingConfig

OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_BSP_SCHEDULE_DELAY",
    "STORMWATCH_OTLP_ENDPOINT",
)


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _options(spans_file: Path, **extra: Any) -> TracingOptions:
    fields: dict[str, Any] = {
        "service_name": "stormwatch-test",
        "tracer_name": "stormwatch.test",
        "spans_file": spans_file,
        **extra,
    }
    return TracingOptions(**fields)


def test_without_variables_the_component_defaults_apply(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    tracing = Tracing(_options(path, resource={"rank": 3}))
    tracing.tracer.start_span("s").end()
    assert tracing.shutdown() == 0
    [span] = _spans(path)
    resource = span["resource"]["attributes"]
    assert resource["service.name"] == "stormwatch-test" and resource["rank"] == 3
    assert tracing.destination == str(path)


def test_sdk_disabled_records_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "TRUE")
    path = tmp_path / "spans.jsonl"
    tracing = Tracing(_options(path))
    with tracing.tracer.start_as_current_span("s") as span:
        assert not span.is_recording()
    assert tracing.shutdown() == 0 and tracing.counts()["ended"] == 0
    assert not path.exists()
    assert "OTEL_SDK_DISABLED" in tracing.destination


def test_service_name_and_resource_attributes_over_defaults_under_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer-eu")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,rank=99")
    path = tmp_path / "spans.jsonl"
    tracing = Tracing(_options(path, resource={"rank": 3}))
    tracing.tracer.start_span("s").end()
    tracing.shutdown()
    resource = _spans(path)[0]["resource"]["attributes"]
    assert resource["service.name"] == "trainer-eu"  # env over the default
    assert resource["deployment.environment"] == "prod"
    assert resource["rank"] == 3  # the component's flag over the env


def test_endpoint_precedence_flag_then_traces_variable_then_base_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert resolve_endpoint(None) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    assert resolve_endpoint(None) == "http://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://tempo:4318/otlp/traces")
    assert resolve_endpoint(None) == "http://tempo:4318/otlp/traces"
    assert resolve_endpoint("http://flag:4318/v1/traces") == "http://flag:4318/v1/traces"
    assert resolve_endpoint("http://flag:4318") == "http://flag:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "tempo:4318")
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        resolve_endpoint(None)


class _Receiver:
    """An OTLP/HTTP traces receiver (aiohttp on its own loop thread) noting names and headers."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.headers: list[dict[str, str]] = []  # names lower-cased
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)

        async def start() -> str:
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", 0).start()
            host, port = self._runner.addresses[0][:2]
            return f"http://{host}:{port}"

        self.url = asyncio.run_coroutine_threadsafe(start(), self._loop).result(30)

    async def _traces(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        message = ExportTraceServiceRequest.FromString(await request.read())
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        for resource_spans in message.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.names.extend(span.name for span in scope_spans.spans)
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason=OTLP_PACKAGE)
    found = _Receiver()
    yield found
    found.stop()


def test_the_environment_endpoint_and_headers_send_spans_over_otlp_instead_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, receiver: _Receiver
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team-a")
    path = tmp_path / "spans.jsonl"
    tracing = Tracing(_options(path))
    tracing.tracer.start_span("over.otlp").end()
    assert tracing.shutdown() == 0
    assert receiver.names == ["over.otlp"]
    assert receiver.headers[0]["x-tenant"] == "team-a"
    assert tracing.destination == receiver.url + "/v1/traces"
    assert not path.exists()


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
)
@pytest.mark.parametrize("protocol", ["grpc", "http/json"])
def test_a_protocol_the_exporter_does_not_speak_is_a_config_error(
    variable: str, protocol: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv(variable, protocol)
    with pytest.raises(ConfigError, match=f"{variable}: '{protocol}' is not supported"):
        Tracing(_options(tmp_path / "spans.jsonl"))
    monkeypatch.setenv(variable, "http/protobuf")
    assert resolve_endpoint(None) == "http://collector:4317/v1/traces"


def test_the_resource_follows_the_semantic_conventions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES",
        "k8s.pod.name=agent-x1,k8s.namespace.name=stormwatch,k8s.node.name=gpu-1",
    )
    path = tmp_path / "spans.jsonl"
    tracing = Tracing(_options(path))
    tracing.tracer.start_span("s").end()
    tracing.shutdown()
    resource = json.loads(path.read_text())["resource"]["attributes"]
    assert resource["service.namespace"] == "stormwatch"
    assert resource["host.name"] == socket.gethostname()
    assert resource["process.pid"] == os.getpid()
    assert resource["k8s.pod.name"] == "agent-x1" and resource["k8s.node.name"] == "gpu-1"


def test_one_meaning_of_the_endpoint_in_every_component(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, receiver: _Receiver
) -> None:
    """The agent's and the trainer's --otlp-endpoint and the controller's
    STORMWATCH_OTLP_ENDPOINT take the collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT."""
    agent = AgentTracing(TracingSettings(node="n1", otlp_endpoint=receiver.url))
    trainer = RankTracing(TracingConfig(otlp_endpoint=receiver.url), rank=0)
    monkeypatch.setenv("STORMWATCH_OTLP_ENDPOINT", receiver.url)
    experiment = ExperimentTrace("exp-1", "title")
    experiment.export_to(tmp_path)
    for component in (agent, trainer._tracing, experiment._tracing):
        assert component.destination == receiver.url + "/v1/traces"
    agent.shutdown()
    with trainer.span("step"):
        pass
    assert trainer.close() == 0
    experiment.end("completed")
    assert sorted(receiver.names) == ["experiment", "step"]


def test_each_components_flag_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, receiver: _Receiver
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nobody there
    agent = AgentTracing(TracingSettings(node="n1", otlp_endpoint=receiver.url))
    assert agent.destination == receiver.url + "/v1/traces"
    agent.shutdown()
    trainer = RankTracing(TracingConfig(otlp_endpoint=receiver.url + "/v1/traces"), rank=0)
    with trainer.span("step"):
        pass
    assert trainer.close() == 0
    monkeypatch.setenv("STORMWATCH_OTLP_ENDPOINT", receiver.url)
    experiment = ExperimentTrace("exp-1", "title")
    experiment.export_to(tmp_path)
    experiment.end("completed")
    assert sorted(receiver.names) == ["experiment", "step"]
    assert not (tmp_path / "spans.jsonl").exists()


def test_the_environment_endpoint_wins_over_a_default_spans_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, receiver: _Receiver
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url + "/v1/traces")
    tracing = RankTracing(TracingConfig(spans_dir=tmp_path / "spans"), rank=2)
    with tracing.span("step"):
        pass
    assert tracing.close() == 0
    assert receiver.names == ["step"]
    assert not (tmp_path / "spans").exists()


def test_sampler_variables_are_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    path = tmp_path / "spans.jsonl"
    tracing = Tracing(_options(path))
    for i in range(20):
        tracing.tracer.start_span(f"s{i}").end()
    tracing.shutdown()
    assert _spans(path) == []


def test_batch_schedule_delay_variable_overrides_the_component_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # milliseconds
    path = tmp_path / "spans.jsonl"
    tracing = Tracing(_options(path, schedule_delay=600.0))
    try:
        tracing.tracer.start_span("soon").end()
        deadline = time.monotonic() + 10
        while not _spans(path):  # exported by the batch worker, no flush asked
            assert time.monotonic() < deadline, "the batch processor kept the 600 s delay"
            time.sleep(0.05)
    finally:
        tracing.shutdown()


def test_an_otlp_destination_without_the_package_is_a_config_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    with pytest.raises(ConfigError, match=f"pip install {OTLP_PACKAGE}"):
        Tracing(_options(tmp_path / "spans.jsonl"))
    # The controller falls back to its spans file (with a warning) and runs on.
    experiment = ExperimentTrace("exp-2", "title")
    experiment.export_to(tmp_path)
    experiment.end("completed")
    assert [s["name"] for s in _spans(tmp_path / "spans.jsonl")] == ["experiment"]


def test_importing_the_set_up_builds_nothing_and_imports_no_torch() -> None:
    code = (
        "import sys, stormwatch.otel, stormwatch.sqlite, stormwatch.clients, stormwatch.platforms\n"
        "from opentelemetry import trace\n"
        "print(type(trace.get_tracer_provider()).__name__, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ProxyTracerProvider", "False"]
