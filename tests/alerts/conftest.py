"""Fixtures for the alerts tests: a real responder process, a lab run directory for its lab
backend, a Prometheus stand-in, HTTP helpers.

Everything listens on 127.0.0.1 with ports chosen by the kernel, and is
stopped at the end of the test.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from stormwatch.contracts.responder import IncidentMember, IncidentRecord
from stormwatch.lab import Lab
from stormwatch.lab.config import LabConfig
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import StateStore, plan_state

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


def request(
    method: str,
    url: str,
    *,
    token: str | None = None,
    body: bytes | dict[str, Any] | list[Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> Reply:
    """One HTTP request with the standard library; JSON bodies are decoded."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    if data is not None:
        all_headers.setdefault("Content-Type", "application/json")
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, path, body=data, headers=all_headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            decoded: Any = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode(errors="replace")
        return Reply(resp.status, decoded, dict(resp.getheaders()))
    finally:
        conn.close()


@dataclass
class ResponderProcess:
    """A ``stormwatch alerts serve`` subprocess."""

    db: Path
    token: str
    token_file: Path
    log: Path
    args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    #: Extra environment of the next start (e.g. a test-only crash point).
    env: dict[str, str] = field(default_factory=dict)

    def start(self, timeout: float = 30.0) -> ResponderProcess:
        cmd = [
            STORMWATCH,
            "-vv",
            "alerts",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--db",
            str(self.db),
            "--token-file",
            str(self.token_file),
            *self.args,
        ]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log, env={**os.environ, **self.env}
            )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"responder did not start; log:\n{self.log.read_text()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1)
                if not chunk:
                    continue
                line += chunk
        text = line.decode().strip()
        assert text.startswith("listening on "), text
        self.url = text.removeprefix("listening on ")
        return self

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=15)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def restart(self, sig: int = signal.SIGTERM) -> ResponderProcess:
        self.stop(sig)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.start()

    def get(self, what: str) -> list[dict[str, Any]]:
        reply = request("GET", f"{self.url}/v1/{what}", token=self.token)
        assert reply.status == 200, reply
        return reply.body[what]

    def post(self, payload: dict[str, Any] | bytes, **kw: Any) -> Reply:
        return request("POST", f"{self.url}/v1/alertmanager", token=self.token, body=payload, **kw)


@pytest.fixture
def token_file(tmp_path: Path) -> tuple[str, Path]:
    token = secrets.token_urlsafe(32)
    path = tmp_path / "responder.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token, path


@pytest.fixture
def start_responder(
    tmp_path: Path, token_file: tuple[str, Path]
) -> Iterator[Callable[..., ResponderProcess]]:
    """Start a responder: ``start_responder(*extra_args, db=None, env=None)``; all are stopped
    afterwards."""
    started: list[ResponderProcess] = []

    def start(
        *args: str, db: Path | None = None, env: dict[str, str] | None = None
    ) -> ResponderProcess:
        if "--postmortem-dir" not in args:  # post-mortems only where a test looks at them
            args = (*args, "--no-postmortems")
        token, path = token_file
        proc = ResponderProcess(
            db=db or tmp_path / "responder.sqlite",
            token=token,
            token_file=path,
            log=tmp_path / f"responder-{len(started)}.log",
            args=args,
            env=dict(env or {}),
        )
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop(signal.SIGKILL)


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    """A lab run directory with lab.json and the lab's target file naming two nodes and
    their metrics dirs."""
    paths = RunPaths.of(tmp_path / "run")
    # grace 1 s: the stand-in workers ignore SIGTERM, a restart SIGKILLs them after it
    state = plan_state(paths, LabConfig(nodes=2, grace_period_s=1))
    for node in state.nodes:  # <run>/nodes/<name>/metrics
        node.metrics_dir.mkdir(parents=True)
    StateStore(paths).save(state)
    Lab(paths.run_dir)._write_target_file(state)  # what the responder reads
    return paths.run_dir


@pytest.fixture(scope="module")
def module_responder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResponderProcess]:
    """One responder (no Prometheus URL) shared by a module's tests.

    Tests sharing it must keep apart by their own group keys and fingerprints.
    """
    folder = tmp_path_factory.mktemp("responder")
    token = secrets.token_urlsafe(32)
    path = folder / "responder.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    proc = ResponderProcess(
        db=folder / "responder.sqlite",
        token=token,
        token_file=path,
        log=folder / "responder.log",
        args=("--no-postmortems",),
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop(signal.SIGKILL)


def iso(ts: float) -> str:
    """Unix seconds as Alertmanager's RFC 3339 (nanosecond digits, like Go)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


def make_alert(
    *,
    status: str = "firing",
    starts_at: float,
    ends_at: float | None = None,
    fingerprint: str = "5f0d3c1a9b7e2d44",
    alertname: str = "StormwatchRankStalled",
    job: str = "train",
    rank: str = "1",
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {
            "alertname": alertname,
            "training_job": job,
            "rank": rank,
            "severity": "critical",
        },
        "annotations": {"summary": f"Rank {rank} of job {job} stopped making progress"},
        "startsAt": iso(starts_at),
        "endsAt": iso(ends_at) if ends_at is not None else "0001-01-01T00:00:00Z",
        "generatorURL": "http://127.0.0.1:19090/graph",
        "fingerprint": fingerprint,
    }


def make_payload(*alerts: dict[str, Any], group_key: str | None = None) -> dict[str, Any]:
    """An Alertmanager webhook payload (version 4) around ``alerts``."""
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return {
        "version": "4",
        "groupKey": group_key or '{}:{alertname="StormwatchRankStalled", training_job="train"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "stormwatch-responder",
        "groupLabels": {"alertname": "StormwatchRankStalled", "training_job": "train"},
        "commonLabels": {"alertname": "StormwatchRankStalled", "training_job": "train"},
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:19093",
        "alerts": list(alerts),
    }


@dataclass
class FakePrometheus:
    """Serves Prometheus-API-shaped JSON for the queries ``confirm_restart`` makes.

    A stand-in for an external service: it answers ``GET /api/v1/query`` from
    the values below, which a test changes while the responder polls.
    """

    restart_before: float | None = 0.0  # the job's attempt
    restart_now: float | None = 0.0
    nodes_before: dict[str, float] = field(default_factory=dict)  # node -> its own count
    nodes_now: dict[str, float] = field(default_factory=dict)
    world_size: float | None = 2.0
    progress: dict[str, float] = field(default_factory=dict)
    fail: bool = False
    queries: list[tuple[str, str | None]] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, query: str) -> list[dict[str, Any]]:
        def sample(value: float | None, **labels: str) -> list[dict[str, Any]]:
            return (
                [] if value is None else [{"metric": labels, "value": [time.time(), repr(value)]}]
            )

        if "max_over_time(stormwatch_train_node_restarts" in query:
            return [s for n, v in sorted(self.nodes_before.items()) for s in sample(v, node=n)]
        if "stormwatch_train_node_restarts" in query:
            return [s for n, v in sorted(self.nodes_now.items()) for s in sample(v, node=n)]
        if "max_over_time(stormwatch_train_job_restarts" in query:
            return sample(self.restart_before)
        if "stormwatch_train_job_restarts" in query:
            return sample(self.restart_now)
        if "stormwatch_train_world_size" in query:
            return sample(self.world_size)
        if "stormwatch_rank_last_progress_timestamp_seconds" in query:
            return [s for rank, v in sorted(self.progress.items()) for s in sample(v, rank=rank)]
        raise AssertionError(f"unexpected query {query!r}")


@pytest.fixture
def fake_prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            params = parse_qs(parts.query)
            body: dict[str, Any]
            with fake.lock:
                if parts.path != "/api/v1/query" or fake.fail:
                    status, body = (
                        503,
                        {
                            "status": "error",
                            "errorType": "unavailable",
                            "error": "stand-in says no",
                        },
                    )
                else:
                    query = params["query"][0]
                    fake.queries.append((query, params.get("time", [None])[0]))
                    status = 200
                    body = {
                        "status": "success",
                        "data": {"resultType": "vector", "result": fake.answer(query)},
                    }
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def unique_fingerprint() -> str:
    """A fresh 16-hex-digit alert fingerprint."""
    return uuid.uuid4().hex[:16]


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (closed again; tiny race, fine on loopback)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def start_service(tmp_path: Path, wait_for: Callable[..., Any]) -> Iterator[Callable[..., str]]:
    """Start a Prometheus-style binary: ``start_service(name, args, ready_url)`` -> its base URL.

    Skips the test when the binary is not installed; terminates it afterwards.
    """
    procs: list[tuple[subprocess.Popen[bytes], Any]] = []

    def start(binary: str, args: list[str], port: int) -> str:
        path = shutil.which(binary)
        if path is None:
            pytest.skip(f"{binary} is not installed")
        log_path = tmp_path / f"{binary}.log"
        log = log_path.open("wb")
        proc = subprocess.Popen([path, *args], stdout=log, stderr=subprocess.STDOUT)
        procs.append((proc, log))
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert proc.poll() is None, log_path.read_text()
            try:
                return request("GET", f"{url}/-/ready", timeout=2).status == 200
            except OSError:
                return False

        wait_for(ready, 60, f"{binary} ready", interval=0.2)
        return url

    yield start
    for proc, log in procs:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
        log.close()


def closed_incident(
    alertname: str, labels: dict[str, str], at: float, incident_id: int = 1
) -> IncidentRecord:
    """A closed incident (group ``g``) of one resolved alert ``alertname`` with ``labels``
    (``alertname`` added), firing at Unix time ``at`` for 20 s."""
    labels = {"alertname": alertname, **labels}
    member = IncidentMember(
        fingerprint="f1",
        alertname=alertname,
        status="resolved",
        labels=labels,
        annotations={},
        group_key="g",
        starts_at=at,
        ends_at=at + 20,
        joined_at=at + 1,
        resolved_at=at + 21,
    )
    return IncidentRecord(
        id=incident_id,
        group_key="g",
        group_labels={"alertname": alertname},
        status="closed",
        alertname=alertname,
        labels=labels,
        annotations={},
        starts_at=at,
        ends_at=at + 20,
        opened_at=at + 1,
        closed_at=at + 21,
        first_alert=member,
        first_alert_tied=False,
        members=[member],
    )


class Kit:
    """Helpers for test modules (importlib mode: they cannot import conftest)."""

    request = staticmethod(request)
    alert = staticmethod(make_alert)
    payload = staticmethod(make_payload)
    iso = staticmethod(iso)
    fingerprint = staticmethod(unique_fingerprint)
    closed_incident = staticmethod(closed_incident)
    free_port = staticmethod(free_port)
    stormwatch = STORMWATCH
    responder_process = ResponderProcess


@pytest.fixture(scope="session")
def kit(wait_for: Callable[..., Any]) -> type[Kit]:
    """The helper namespace :class:`Kit`, with ``wait_for`` (``tests/conftest.py``)."""
    return type("Kit", (Kit,), {"wait_for": staticmethod(wait_for)})
