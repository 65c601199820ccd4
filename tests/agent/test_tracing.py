"""The agent's own actions as spans: to a JSON-lines file or OTLP, fork-safe (FC-07), bounded (FC-08)."""

from __future__ import annotations

import json
import multiprocessing
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

from stormwatch.agent import AgentConfig, AgentConfigError
from stormwatch.agent.tracing import AgentTracing, TracingSettings
from stormwatch.otel import OTLP_PACKAGE


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"] == name]


def test_fault_and_collector_spans_reach_the_trace_file(
    start_agent: Any, tools: Any, tmp_path: Path, metrics_dir: Path
) -> None:
    trace_file = tmp_path / "spans.jsonl"
    agent = start_agent(trace_file=trace_file)
    # A fault for a rank that is not here: a failed fault.inject span (404).
    body = {"id": "f1", "kind": "kill_rank", "rank": 5, "job": "nojob", "ttl_seconds": 5}
    reply = tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
    assert reply.status == 404
    # A corrupt multiprocess file takes the trainer collector down, then it recovers.
    bad = metrics_dir / "counter_999999.db"
    bad.write_bytes(b"\x10\x00\x00\x00garbage-not-an-mmap-dict")
    # Still failing on the next renders (about one a second): counted, not traced again.
    tools.wait_for(
        lambda: (
            (
                tools.scrape(agent.url).value(
                    "stormwatch_collector_errors_total", collector="trainer"
                )
                or 0
            )
            >= 2
        )
    )
    bad.unlink()
    tools.wait_for(
        lambda: tools.scrape(agent.url).value("stormwatch_collector_up", collector="trainer") == 1
    )
    agent.stop()  # flushes

    spans = _spans(trace_file)
    (inject,) = _named(spans, "fault.inject")
    assert inject["attributes"]["stormwatch.fault.id"] == "f1"
    assert inject["attributes"]["stormwatch.fault.rank"] == 5
    assert inject["status"]["status_code"] == "ERROR"
    assert any(event["name"] == "exception" for event in inject["events"])
    assert inject["resource"]["attributes"]["service.name"] == "stormwatch-agent"
    (failure,) = _named(spans, "collector.failure")
    assert failure["attributes"]["stormwatch.collector"] == "trainer"
    assert failure["status"]["status_code"] == "ERROR"
    assert len(_named(spans, "collector.recovered")) == 1


def test_rank_exit_and_fault_revert_spans(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    trace_file = tmp_path / "spans.jsonl"
    agent = start_agent(trace_file=trace_file)
    launcher = fake_torchrun([0, 1])
    launcher.wait_pid(0), launcher.wait_pid(1)
    tools.wait_for(lambda: len(tools.http("GET", agent.url + "/v1/ranks").json()["ranks"]) == 2)
    body = {"id": "k1", "kind": "kill_rank", "rank": 1, "job": launcher.job, "ttl_seconds": 600}
    reply = tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
    assert reply.status == 201, reply.text
    tools.wait_for(
        lambda: (
            tools.scrape(agent.url).value(
                "stormwatch_rank_unexpected_exits_total", training_job=launcher.job, rank="1"
            )
            == 1
        )
    )
    assert tools.http("DELETE", agent.fault_url + "/v1/faults/k1", token=tools.token).status == 200
    agent.stop()

    spans = _spans(trace_file)
    (inject,) = _named(spans, "fault.inject")
    assert inject["status"]["status_code"] == "UNSET"
    assert inject["attributes"]["stormwatch.fault.state"] == "applied"
    (exit_span,) = _named(spans, "rank.exit")
    assert exit_span["attributes"]["stormwatch.job"] == launcher.job
    assert exit_span["attributes"]["stormwatch.rank"] == 1
    assert exit_span["attributes"]["stormwatch.rank.clean_exit"] is False
    assert (
        exit_span["attributes"]["process.pid"]
        == inject["attributes"]["stormwatch.fault.target_pid"]
    )
    reverts = _named(spans, "fault.revert")
    assert next(r["attributes"]["stormwatch.fault.revert_reason"] for r in reverts) == "request"


def _child_records_a_span(trace_file: str) -> None:
    from stormwatch.agent import tracing as module

    del module  # the child uses the parent's AgentTracing, inherited through fork
    _TRACING["tracing"].tracer.start_span("child.work", attributes={"pid": 1}).end()


_TRACING: dict[str, AgentTracing] = {}


def test_fc07_forked_child_spans_reach_the_trace_file(tmp_path: Path) -> None:
    """Tracing set up after start in the parent; a fork-started child's spans still arrive."""
    trace_file = tmp_path / "spans.jsonl"
    tracing = AgentTracing(TracingSettings(node="n1", trace_file=trace_file, schedule_delay=60))
    _TRACING["tracing"] = tracing
    try:
        tracing.tracer.start_span("parent.before_fork").end()  # queued, not yet exported
        context = multiprocessing.get_context("fork")
        child = context.Process(target=_child_records_a_span, args=(str(trace_file),))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        # The child flushed before its os._exit; nothing of the parent's queue was duplicated.
        names = [span["name"] for span in _spans(trace_file)]
        assert names == ["child.work"]
        tracing.shutdown()
        names = sorted(span["name"] for span in _spans(trace_file))
        assert names == ["child.work", "parent.before_fork"]
    finally:
        tracing.shutdown()
        _TRACING.clear()


def test_fc07_importing_the_agent_sets_up_no_tracing() -> None:
    code = (
        "import stormwatch.agent, stormwatch.agent.runtime, stormwatch.agent.tracing\n"
        "from opentelemetry import trace\n"
        "print(type(trace.get_tracer_provider()).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ProxyTracerProvider"


@pytest.fixture
def blackhole() -> Iterator[str]:
    """An HTTP endpoint that accepts connections and never answers (nor reads)."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def test_fc08_tracing_shutdown_is_bounded_when_the_collector_never_answers(
    blackhole: str,
) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason=OTLP_PACKAGE)
    tracing = AgentTracing(
        TracingSettings(node="n1", otlp_endpoint=blackhole, flush_timeout=1.0, schedule_delay=0.05)
    )
    for i in range(5):
        tracing.tracer.start_span(f"s{i}").end()
    time.sleep(0.3)  # the batch worker is now stuck in an export to the black hole
    started = time.monotonic()
    tracing.shutdown()
    assert time.monotonic() - started < 2.5
    counts = tracing.counts()
    assert counts["ended"] == 5 and counts["exported"] == 0


def test_fc08_agent_exit_is_not_delayed_by_an_otlp_endpoint_that_never_answers(
    agent_process: Any, blackhole: str, tools: Any
) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason=OTLP_PACKAGE)
    agent = agent_process("--otlp-endpoint", blackhole)
    body = {"id": "f1", "kind": "kill_rank", "rank": 5, "job": "nojob", "ttl_seconds": 5}
    for i in range(3):
        body["id"] = f"f{i}"
        tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
    time.sleep(1.5)  # the first batch export is in flight, waiting for an answer
    started = time.monotonic()
    assert agent.stop() == 0
    elapsed = time.monotonic() - started
    assert elapsed < 8.0, f"agent took {elapsed:.1f} s to exit"
    assert "not exported" in agent.log.read_text()


def test_spans_are_exported_over_otlp(start_agent: Any, tools: Any) -> None:
    """A real OTLP/HTTP receiver (aiohttp) gets the agent's spans as protobuf."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason=OTLP_PACKAGE)
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    received: list[str] = []

    async def traces(request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in message.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                received.extend(span.name for span in scope_spans.spans)
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    receiver = _Server(app)
    try:
        agent = start_agent(otlp_endpoint=receiver.url)
        body = {"id": "f1", "kind": "kill_rank", "rank": 5, "job": "nojob"}
        assert tools.http(
            "POST", agent.fault_url + "/v1/faults", body=body, token=tools.token
        ).status
        agent.stop()
        assert received == ["fault.inject"]
    finally:
        receiver.stop()


def test_otlp_without_the_exporter_package_names_the_pip_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(AgentConfigError, match=f"pip install {OTLP_PACKAGE}"):
        AgentTracing(TracingSettings(node="n1", otlp_endpoint="http://127.0.0.1:4318"))


@pytest.mark.parametrize(
    "url", ["127.0.0.1:4318", "grpc://h:4317", "http://", "http://[::1", "http://h:99999"]
)
def test_bad_otlp_endpoint_is_a_config_error(url: str, tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match="otlp_endpoint"):
        AgentConfig.build(metrics_dir=tmp_path, otlp_endpoint=url)


def test_an_otlp_endpoint_that_does_not_parse_stops_agent_run_with_exit_2(tmp_path: Path) -> None:
    """``http://[::1`` makes urlsplit raise: the agent names the option, no traceback."""
    stormwatch = str(Path(sys.executable).with_name("stormwatch"))
    done = subprocess.run(
        [stormwatch, "agent", "run", "--metrics-dir", str(tmp_path), "--gpu-backend", "sim",
         "--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0",
         "--otlp-endpoint", "http://[::1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "otlp_endpoint (--otlp-endpoint): expected http(s)://HOST:PORT" in done.stderr


class _Server:
    """An aiohttp app on 127.0.0.1 with its own loop thread."""

    def __init__(self, app: web.Application) -> None:
        import asyncio

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner = web.AppRunner(app, access_log=None)

        async def start() -> str:
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            host, port = self._runner.addresses[0][:2]
            return f"http://{host}:{port}"

        self.url = asyncio.run_coroutine_threadsafe(start(), self._loop).result(30)

    def stop(self) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()
