"""Fixtures for the agent tests: in-process agents on loopback, fake torchrun trees, scraping.

Nothing of the agent is mocked: agents are real (aiohttp on 127.0.0.1, SQLite
ledger, psutil rank watcher); only the GPU is simulated (:class:`FakeNvml`),
and "torchrun" is a tiny Python launcher named ``torchrun`` that starts real
rank processes with torchrun's environment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stormwatch.agent import Agent, AgentConfig, FakeNvml
from stormwatch.agent.kube.testing import KubeletServer
from stormwatch.platforms.stopping import stop_processes

TOKEN = "test-token-0123456789"

#: dcgm-exporter's published files (test data, unchanged).
PEERS = Path(__file__).resolve().parents[3] / "shared" / "peers" / "dcgm-exporter"


@dataclasses.dataclass(frozen=True)
class DcgmCounter:
    """One field row of dcgm-exporter's ``default-counters.csv``.

    ``enabled`` is False for the rows shipped commented out (``# DCGM_..., type, help``).
    """

    name: str
    type: str
    help: str
    enabled: bool


def dcgm_counters() -> dict[str, DcgmCounter]:
    """Every field row of ``default-counters.csv``, commented or not (an enabled row wins)."""
    rows: dict[str, DcgmCounter] = {}
    for line in (PEERS / "default-counters.csv").read_text().splitlines():
        text = line.strip()
        enabled = not text.startswith("#")
        text = text.lstrip("#").strip()
        parts = [part.strip() for part in text.split(",", 2)]
        if len(parts) != 3 or not parts[0].startswith("DCGM_"):
            continue
        if parts[1] not in ("gauge", "counter", "label"):
            continue
        row = DcgmCounter(parts[0], parts[1], parts[2], enabled)
        if enabled or parts[0] not in rows:
            rows[parts[0]] = row
    return rows


# ------------------------------------------------------------------ HTTP
@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def http(
    method: str,
    url: str,
    *,
    body: Any = None,
    token: str | None = None,
    raw: bytes | None = None,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> Reply:
    """One HTTP request; non-2xx answers are returned, not raised."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Reply(response.status, response.read(), dict(response.headers))
    except urllib.error.HTTPError as err:
        with err:
            return Reply(err.code, err.read(), dict(err.headers))


class Scrape:
    """Parsed exposition: ``families`` by exposed name, samples by sample name."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families: dict[str, str] = {}
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        self.family_labels: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(text):
            # A counter typed under its own name (dcgm-exporter's, no _total): the
            # parser renames its samples <name>_total; keep the exposed names.
            bare = family.type == "counter" and f"# TYPE {family.name} counter\n" in text
            exposed = (
                family.name + "_total" if family.type == "counter" and not bare else family.name
            )
            self.families[exposed] = "untyped" if family.type == "unknown" else family.type
            labels = self.family_labels.setdefault(exposed, set())
            for sample in family.samples:
                name = family.name if bare else sample.name
                self.samples.setdefault(name, []).append((dict(sample.labels), sample.value))
                labels.update(sample.labels)

    def series(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [
            (lab, value)
            for lab, value in self.samples.get(name, [])
            if all(lab.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float | None:
        found = self.series(name, **labels)
        assert len(found) <= 1, f"{name}{labels} matches {len(found)} series"
        return found[0][1] if found else None


def scrape(url: str) -> Scrape:
    reply = http("GET", url + "/metrics")
    assert reply.status == 200, reply.text
    return Scrape(reply.text)


# ----------------------------------------------------------------- agents
class AgentThread:
    """An :class:`Agent` serving from its own event loop on a background thread."""

    def __init__(self, config: AgentConfig, fake: FakeNvml | None) -> None:
        self.config = config
        self.fake = fake
        self.agent = Agent(config, fake_nvml=fake)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._running = False

    def start(self) -> AgentThread:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.agent.start(), self._loop).result(60)
        except BaseException:
            self._close_loop()
            raise
        self._running = True
        return self

    @property
    def url(self) -> str:
        """The read-only listener (``/metrics``, ``/healthz``, ``/v1/ranks``, ``/v1/events``)."""
        return self.agent.url

    @property
    def fault_url(self) -> str:
        """The fault API's listener (``/v1/faults``)."""
        return self.agent.fault_url

    def sample(self) -> None:
        """Take a GPU sample now (tests run with a long sample interval)."""
        assert self.agent.sampler is not None
        self.agent.sampler.sample()

    def stop(self) -> None:
        if self._running:
            self._running = False
            asyncio.run_coroutine_threadsafe(self.agent.stop(), self._loop).result(60)
            self._close_loop()

    def _close_loop(self) -> None:
        async def drain() -> None:
            loop = asyncio.get_running_loop()
            await loop.shutdown_asyncgens()
            await loop.shutdown_default_executor()

        asyncio.run_coroutine_threadsafe(drain(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "agent.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def metrics_dir(tmp_path: Path) -> Path:
    path = tmp_path / "metrics"
    path.mkdir()
    return path


def make_agent(base: Path, fake: FakeNvml | None = None, **overrides: Any) -> AgentThread:
    """Start an agent whose files live under ``base`` (token, metrics dir, state dir)."""
    base.mkdir(parents=True, exist_ok=True)
    token_file = base / "agent.token"
    if not token_file.exists():
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
    values: dict[str, Any] = {
        "listen_host": "127.0.0.1",
        "listen_port": 0,
        "node": "node-test",
        "metrics_dir": base / "metrics",
        "gpu_backend": "sim",
        "token_file": token_file,
        "fault_listen_host": "127.0.0.1",  # the fault API's own listener, any free port
        "fault_listen_port": 0,
        "state_dir": base / "state",
        "sample_interval": 3600.0,  # tests sample explicitly
        "rank_scan_interval": 0.1,
    }
    values.update(overrides)
    return AgentThread(
        AgentConfig.build(**values), fake if fake is not None else FakeNvml(2)
    ).start()


@pytest.fixture
def kubelet() -> Iterator[KubeletServer]:
    """A kubelet pod-resources gRPC server on a unix socket (short path: sun_path is 108 bytes)."""
    folder = tempfile.mkdtemp(prefix="kubelet-")
    server = KubeletServer(os.path.join(folder, "kubelet.sock"))
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def start_agent(tmp_path: Path, metrics_dir: Path) -> Iterator[Callable[..., AgentThread]]:
    """Start an in-process agent: ``start_agent(fake=FakeNvml(2), **config overrides)``.

    Its files live under ``tmp_path`` (``metrics``, ``state``, ``agent.token``);
    every agent started is stopped at the end of the test.
    """
    started: list[AgentThread] = []

    def start(fake: FakeNvml | None = None, **overrides: Any) -> AgentThread:
        handle = make_agent(tmp_path, fake, **overrides)
        started.append(handle)
        return handle

    yield start
    for handle in reversed(started):
        handle.stop()


# ------------------------------------------------------------ fake ranks
RANK_CODE = textwrap.dedent(
    """
    import os, pathlib, signal, sys, time
    rank = int(os.environ["RANK"])
    job = os.environ["STORMWATCH_JOB"]
    mdir = os.environ.get("STORMWATCH_METRICS_DIR")
    if mdir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = mdir
        from prometheus_client import Counter, Gauge, Histogram
        labels = ["training_job", "rank"]
        live = dict(multiprocess_mode="livemax")
        step = Gauge("stormwatch_train_step", "step", labels, **live)
        beat = Gauge("stormwatch_train_last_step_timestamp_seconds", "beat", labels, **live)
        loss = Gauge("stormwatch_train_loss", "loss", labels, **live)
        tps = Gauge("stormwatch_train_tokens_per_second", "tps", labels, **live)
        world = Gauge("stormwatch_train_world_size", "ws", labels, **live)
        restarts = Gauge("stormwatch_train_node_restarts", "rc", labels, **live)
        dur = Histogram("stormwatch_train_step_duration_seconds", "d", labels)
        steps = Counter("stormwatch_train_steps", "s", labels)
        tokens = Counter("stormwatch_train_tokens", "t", labels)
        ops = labels + ["op"]
        calls = Counter("stormwatch_collective_calls", "c", ops)
        nbytes = Counter("stormwatch_collective_bytes", "b", ops)
        ctime = Counter("stormwatch_collective_duration_seconds", "t", ops)
        lab = dict(training_job=job, rank=str(rank))
        for i in range(1, 4):
            step.labels(**lab).set(i)
            beat.labels(**lab).set(time.time())
            loss.labels(**lab).set(2.0 / i)
            tps.labels(**lab).set(1000.0)
            world.labels(**lab).set(int(os.environ["WORLD_SIZE"]))
            restarts.labels(**lab).set(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
            dur.labels(**lab).observe(0.01)
            steps.labels(**lab).inc()
            tokens.labels(**lab).inc(64)
            calls.labels(op="all_reduce", **lab).inc()
            nbytes.labels(op="all_reduce", **lab).inc(4096)
            ctime.labels(op="all_reduce", **lab).inc(0.001)
        # Every other metric the real trainer defines, one sample each (its catalogue
        # is data; the trainer package imports no torch at this level).
        from stormwatch.telemetry.metrics import CATALOGUE, STEP_DURATION_BUCKETS
        done = {"stormwatch_train_step", "stormwatch_train_last_step_timestamp_seconds",
                "stormwatch_train_loss", "stormwatch_train_tokens_per_second",
                "stormwatch_train_world_size", "stormwatch_train_node_restarts",
                "stormwatch_train_step_duration_seconds", "stormwatch_train_steps",
                "stormwatch_train_tokens", "stormwatch_collective_calls",
                "stormwatch_collective_bytes", "stormwatch_collective_duration_seconds"}
        extra = {"op": "all_reduce", "mesh_dim": "world", "kind": "rss", "point": "slow_step",
                 "sink": "metrics"}
        for spec in CATALOGUE:
            if spec.name in done:
                continue
            values = {**lab, **{k: extra.get(k, "x") for k in spec.labels if k not in lab}}
            if spec.kind == "gauge":
                Gauge(spec.name, "h", spec.labels, **live).labels(**values).set(1.0)
            elif spec.kind == "counter":
                Counter(spec.name, "h", spec.labels).labels(**values).inc()
            else:
                buckets = spec.buckets or STEP_DURATION_BUCKETS
                Histogram(spec.name, "h", spec.labels, buckets=buckets).labels(
                    **values).observe(0.01)
    # FAKE_RANK_EXIT_ON=<file>: on the first attempt, exit once the file exists
    # (code FAKE_RANK_EXIT_CODE, default 1; FAKE_RANK_DONE=1 writes rank<R>.done first).
    exit_on = os.environ.get("FAKE_RANK_EXIT_ON")
    if exit_on and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        while not os.path.exists(exit_on):
            time.sleep(0.02)
        if os.environ.get("FAKE_RANK_DONE") and mdir:
            pathlib.Path(mdir, f"rank{rank}.done").touch()
        sys.exit(int(os.environ.get("FAKE_RANK_EXIT_CODE", "1")))
    def on_sigterm(*_):
        # FAKE_RANK_STOP_MARKER=1: what the telemetry API does at SIGTERM (a stop request)
        if os.environ.get("FAKE_RANK_STOP_MARKER") and mdir:
            pathlib.Path(mdir, f"rank{rank}.stopping").touch()
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_sigterm)
    while True:
        time.sleep(60)
    """
)

LAUNCHER_CODE = textwrap.dedent(
    """
    # A stand-in for torchrun's elastic agent: starts ranks with torchrun's
    # environment and (optionally) restarts a rank that exits non-zero.
    import json, os, signal, subprocess, sys, time
    spec = json.loads(sys.argv[1])
    children = {}
    attempts = {}
    def spawn(rank, local_rank):
        env = dict(os.environ)
        env.update(spec.get("env", {}))
        env.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(spec["world_size"]),
                   TORCHELASTIC_RUN_ID=spec["run_id"], STORMWATCH_JOB=spec["job"],
                   TORCHELASTIC_RESTART_COUNT=str(attempts.get(rank, 0)))
        argv = [sys.executable, "-c", spec["rank_code"], *spec.get("rank_args", [])]
        proc = subprocess.Popen(argv, env=env)
        children[rank] = (proc, local_rank)
        print(json.dumps({"rank": rank, "pid": proc.pid}), flush=True)
    def stop(*_):
        for proc, _ in children.values():
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in children.values():
            proc.wait()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    for local_rank, rank in enumerate(spec["ranks"]):
        spawn(rank, local_rank)
    while True:
        for rank, (proc, local_rank) in list(children.items()):
            if proc.poll() not in (None, 0) and spec.get("restart"):
                attempts[rank] = attempts.get(rank, 0) + 1
                time.sleep(spec.get("restart_delay", 0.0))
                spawn(rank, local_rank)
        time.sleep(0.02)
    """
)


class FakeTorchrun:
    """A launcher process named ``torchrun`` with rank children (reads their pids)."""

    def __init__(self, proc: subprocess.Popen[str], job: str) -> None:
        self.proc = proc
        self.job = job
        self.pids: dict[int, list[int]] = {}

    def wait_pid(self, rank: int, count: int = 1, timeout: float = 30.0) -> int:
        """Pid of the ``count``-th start of ``rank``."""
        deadline = time.monotonic() + timeout
        while len(self.pids.get(rank, [])) < count:
            assert time.monotonic() < deadline, f"rank {rank} start {count} not seen"
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"launcher exited: rc={self.proc.wait()}")
            event = json.loads(line)
            self.pids.setdefault(event["rank"], []).append(event["pid"])
        return self.pids[rank][count - 1]

    def stop(self) -> None:
        """Stop the launcher, then whatever of its job outlived it (ranks orphaned by a
        killed launcher, their data-loader workers): nothing of the job is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        stop_processes(job_processes(self.job), grace_s=5.0)


def job_processes(job: str) -> list[psutil.Process]:
    """The running processes whose environment says they belong to ``job``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("STORMWATCH_JOB") == job and proc.status() != "zombie":
                found.append(proc)
        except psutil.Error:  # gone, or not ours to read: not one of the job's
            continue
    return found


@pytest.fixture
def fake_torchrun(tmp_path: Path, metrics_dir: Path) -> Iterator[Callable[..., FakeTorchrun]]:
    """``fake_torchrun(ranks=[0, 1], restart=False, env={...})``: start a launcher.

    The job name is unique per launcher (``launcher.job``) unless ``job`` is given.
    ``write_metrics`` sets the ranks' ``STORMWATCH_METRICS_DIR`` to this test's
    metrics dir; ``rank_args`` are appended to each rank's command line (e.g.
    ``["train", "--metrics-dir", D]``: the rank's code ignores them); ``rank_code``
    replaces the ranks' Python code (default :data:`RANK_CODE`).
    """
    launched: list[FakeTorchrun] = []
    script = tmp_path / "bin" / "torchrun"
    script.parent.mkdir(exist_ok=True)
    script.write_text(LAUNCHER_CODE)

    def launch(
        ranks: list[int],
        *,
        job: str | None = None,
        world_size: int | None = None,
        restart: bool = False,
        restart_delay: float = 0.0,
        env: dict[str, str] | None = None,
        write_metrics: bool = True,
        rank_args: list[str] | None = None,
        rank_code: str = RANK_CODE,
    ) -> FakeTorchrun:
        # Unique by default: other users' torchrun jobs may run on this machine.
        job = job or f"job-{uuid.uuid4().hex[:8]}"
        rank_env = dict(env or {})
        if write_metrics:
            rank_env["STORMWATCH_METRICS_DIR"] = str(metrics_dir)
        spec = {
            "ranks": ranks,
            "job": job,
            "run_id": f"run-{job}",
            "world_size": world_size or len(ranks),
            "restart": restart,
            "restart_delay": restart_delay,
            "rank_code": rank_code,
            "env": rank_env,
            "rank_args": rank_args or [],
        }
        child_env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        proc = subprocess.Popen(
            [sys.executable, str(script), json.dumps(spec)],
            stdout=subprocess.PIPE,
            text=True,
            env=child_env,
        )
        handle = FakeTorchrun(proc, job)
        launched.append(handle)
        return handle

    yield launch
    for handle in launched:
        handle.stop()


class AgentProcess:
    """``stormwatch agent run`` as a real subprocess (stderr goes to a file)."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        script = Path(sys.executable).with_name("stormwatch")
        with log.open("wb") as sink:
            self.proc = subprocess.Popen([str(script), *args], stdout=sink, stderr=sink, env=env)
        self.url = ""
        self.fault_url = ""

    def wait_listening(self, timeout: float = 60.0) -> str:
        def url() -> str | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}: {self.log.read_text()}")
            for line in self.log.read_text().splitlines():
                if "listening on " in line:
                    if "fault API on " in line:
                        self.fault_url = line.split("fault API on ", 1)[1].split(";")[0]
                    return line.split("listening on ", 1)[1].split()[0]
            return None

        self.url = wait_for(url, timeout=timeout)
        return self.url

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


@pytest.fixture
def agent_process(
    tmp_path: Path, token_file: Path, metrics_dir: Path
) -> Iterator[Callable[..., AgentProcess]]:
    """``agent_process(*extra_args)``: start ``stormwatch agent run`` on 127.0.0.1:0 with sim GPUs."""
    started: list[AgentProcess] = []

    def start(*extra: str) -> AgentProcess:
        args = [
            "agent",
            "run",
            "--listen",
            "127.0.0.1:0",
            "--node",
            "node-proc",
            "--metrics-dir",
            str(metrics_dir),
            "--gpu-backend",
            "sim",
            "--token-file",
            str(token_file),
            "--fault-api-listen",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path / "state"),
            *extra,
        ]
        handle = AgentProcess(args, tmp_path / f"agent-{len(started)}.log")
        started.append(handle)
        handle.wait_listening()
        return handle

    yield start
    for handle in started:
        if handle.proc.poll() is None:
            handle.stop(signal.SIGKILL)


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until truthy; fail with a clear message on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def stop_process_group(leader: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group ``leader`` leads (torchrun and its workers); SIGKILL after
    30 s."""
    os.killpg(leader.pid, signal.SIGTERM)
    try:
        leader.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def promtool_check_metrics(text: str) -> tuple[int, list[str]]:
    """(exit status, non-empty finding lines) of ``promtool check metrics`` over ``text``
    (an exposition); status 3 means lint findings only, no parse error."""
    out = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    return out.returncode, [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]


@pytest.fixture(scope="session")
def tools() -> Any:
    """Helpers as one object (tests run in importlib mode and cannot import conftest)."""

    class Tools:
        http = staticmethod(http)
        scrape = staticmethod(scrape)
        wait_for = staticmethod(wait_for)
        Scrape = Scrape
        make_agent = staticmethod(make_agent)
        dcgm_counters = staticmethod(dcgm_counters)
        promtool_check_metrics = staticmethod(promtool_check_metrics)
        stop_process_group = staticmethod(stop_process_group)
        job_processes = staticmethod(job_processes)
        peers = PEERS
        token = TOKEN

    return Tools
