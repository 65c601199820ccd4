"""Spans: built after process start, exported from forked children, bounded flush at exit."""

from __future__ import annotations

import http.server
import importlib.util
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stormwatch.otel import OTLP_PACKAGE
from stormwatch.telemetry.tracing import RankTracing
from stormwatch.trainer.config import TracingConfig


def _has_otlp() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
    except ModuleNotFoundError:
        return False


HAS_OTLP = _has_otlp()


def _names(path) -> list[str]:
    return [json.loads(line)["name"] for line in path.read_text().splitlines()]


def test_spans_go_to_a_json_lines_file_per_rank_with_parents(tmp_path):
    tracing = RankTracing(TracingConfig(spans_dir=tmp_path), rank=3, attributes={"job": "unit"})
    with tracing.span("step", step=1), tracing.span("forward"):
        pass
    assert tracing.close() == 0
    spans = [json.loads(line) for line in (tmp_path / "rank3.jsonl").read_text().splitlines()]
    by_name = {s["name"]: s for s in spans}
    assert by_name["forward"]["parent_id"] == by_name["step"]["context"]["span_id"]
    assert by_name["step"]["attributes"] == {"step": 1}
    assert by_name["step"]["resource"]["attributes"]["rank"] == 3


def test_without_destinations_spans_are_no_ops(tmp_path):
    tracing = RankTracing(TracingConfig(), rank=0)
    with tracing.span("step"):
        pass
    assert tracing.close() == 0
    assert list(tmp_path.iterdir()) == []


def _child(tracing: RankTracing) -> None:
    with tracing.span("in_child"):
        pass
    tracing.close()


def test_fc07_spans_from_a_forked_child_are_exported(tmp_path):
    tracing = RankTracing(TracingConfig(spans_dir=tmp_path), rank=0)
    with tracing.span("in_parent"):
        pass
    child = multiprocessing.get_context("fork").Process(target=_child, args=(tracing,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    tracing.close()
    assert sorted(_names(tmp_path / "rank0.jsonl")) == ["in_child", "in_parent"]


def test_importing_the_module_builds_no_provider():
    code = (
        "from opentelemetry import trace\n"
        "import stormwatch.telemetry.tracing, stormwatch.trainer.loop\n"
        "assert type(trace.get_tracer_provider()).__name__ == 'ProxyTracerProvider'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


_STUCK_EXIT = """
import sys, time, urllib.request
from stormwatch.trainer.config import TracingConfig
from stormwatch.telemetry.tracing import RankTracing
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

endpoint, use_otlp = sys.argv[1], sys.argv[2] == "1"


class BlockingHttpExporter(SpanExporter):
    # Stand-in for an OTLP/HTTP exporter without a timeout: POSTs and waits for the answer.
    def export(self, spans):
        urllib.request.urlopen(urllib.request.Request(endpoint, data=b"x", method="POST"))
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


config = TracingConfig(otlp_endpoint=endpoint, flush_timeout=1.0)
tracing = RankTracing(config, rank=0, exporter=None if use_otlp else BlockingHttpExporter())
for step in range(50):
    with tracing.span("step", step=step):
        pass
started = time.monotonic()
dropped = tracing.close()
print(f"dropped={dropped} close_seconds={time.monotonic() - started:.2f}", flush=True)
"""


@pytest.mark.parametrize(
    "use_otlp",
    [
        pytest.param(False, id="blocking-http-exporter"),
        pytest.param(
            True,
            id="otlp-http-exporter",
            marks=pytest.mark.skipif(not HAS_OTLP, reason=f"{OTLP_PACKAGE} not installed"),
        ),
    ],
)
def test_fc08_unanswering_endpoint_does_not_delay_exit(use_otlp):
    with socket.socket() as silent:  # accepts connections (kernel backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}/v1/traces"
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", _STUCK_EXIT, endpoint, "1" if use_otlp else "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dropped=50" in done.stdout, done.stdout + done.stderr[-2000:]
    close_seconds = float(done.stdout.split("close_seconds=")[1])
    assert close_seconds < 2.0  # flush_timeout 1 s
    assert seconds < 15, seconds  # interpreter start + imports + bounded close; no hang at exit
    assert "spans not exported" in done.stderr


@pytest.mark.e2e
@pytest.mark.skipif(not HAS_OTLP, reason=f"{OTLP_PACKAGE} not installed")
def test_fc07_trainer_spans_reach_an_otlp_http_sink(tmp_path):
    """A real `stormwatch train` process exports its spans over OTLP/HTTP to a local sink."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    received: list[str] = []

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    received.extend(span.name for span in scope_spans.spans)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "OTEL_"))}
        for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        exe = Path(sys.executable).with_name("stormwatch")
        command = [
            str(exe) if exe.exists() else shutil.which("stormwatch") or "stormwatch", "train",
            "--steps", "2", "--seq-len", "32", "--n-layers", "1",
            "--otlp-endpoint", f"http://127.0.0.1:{server.server_address[1]}/v1/traces",
        ]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(received).count("step") == 2
    for name in ("forward", "backward", "optimizer", "checkpoint_load"):
        assert name in received, received
