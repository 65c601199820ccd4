"""Shared pytest set-up: tests restore the environment they change; a stand-in Grafana;
stand-ins for a torchrun job's processes (``fake_job``: the platform backends and the
responder's guards find and signal them); a self-signed test certificate (``tls_pair``:
the agent's TLS and the clients' TLS tests); the leftover check (``leftovers.py``: a
session that leaves a process, namespace, mount or iptables chain behind fails)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib.util
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiohttp import web


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--leftover-kernel-objects",
        choices=("yes", "no"),
        default="yes",
        help="judge network namespaces, mounts and iptables chains left behind (no: a "
        "session beside another that makes them; processes are always judged)",
    )


def _load(name: str, file: str) -> Any:
    """The module ``tests/<file>`` (by path: the tests run in importlib mode, where
    ``tests/`` is not importable)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def pytest_configure(config: pytest.Config) -> None:
    """Register the leftover check (``tests/leftovers.py``) and the shared Slurm lab
    (``tests/slurm_lab.py``: the ``slurm_lab`` fixture and the hooks that order its users
    and bring it down after the last)."""
    if not config.pluginmanager.has_plugin("stormwatch-leftovers"):
        leftovers = _load("stormwatch_test_leftovers", "leftovers.py")
        config.pluginmanager.register(leftovers.Leftovers(), "stormwatch-leftovers")
    if not config.pluginmanager.has_plugin("stormwatch-slurm-lab"):
        config.pluginmanager.register(
            _load("stormwatch_test_slurm_lab", "slurm_lab.py"), "stormwatch-slurm-lab"
        )


#: The Bearer token the stand-in Grafana (``grafana`` fixture) accepts.
GRAFANA_TEST_TOKEN = "glsa_test-token"


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


class FakeGrafana:
    """Grafana's folder, dashboard and annotation endpoints, in memory; records every request.

    Requests are checked against Grafana's documented HTTP API
    (grafana.com/docs/grafana/latest/developers/http_api/{dashboard,folder,annotations}/);
    what does not follow it lands in :attr:`problems` (the fixture asserts it stays empty).
    """

    def __init__(self) -> None:
        self.folders: list[dict[str, Any]] = []
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.annotations: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.problems: list[str] = []
        self.url = ""
        app = web.Application(middlewares=[self._check_auth])
        app.router.add_get("/api/search", self.search)
        app.router.add_get("/api/folders", self.list_folders)
        app.router.add_post("/api/folders", self.create_folder)
        app.router.add_get("/api/dashboards/uid/{uid}", self.get_dashboard)
        app.router.add_post("/api/dashboards/db", self.save_dashboard)
        app.router.add_post("/api/annotations", self.add_annotation)
        self.app = app

    @web.middleware
    async def _check_auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {GRAFANA_TEST_TOKEN}":
            return web.json_response({"message": "Unauthorized"}, status=401)
        if request.method == "POST" and request.content_type != "application/json":
            self.problems.append(f"{request.path}: Content-Type {request.content_type}")
            return web.json_response({"message": "bad content type"}, status=415)
        response: web.StreamResponse = await handler(request)
        return response

    async def search(self, request: web.Request) -> web.Response:
        hits = [
            {"uid": uid, "title": d["dashboard"]["title"], "type": "dash-db"}
            for uid, d in self.dashboards.items()
        ]
        return web.json_response(hits)

    async def list_folders(self, request: web.Request) -> web.Response:
        return web.json_response(
            [{"id": f["id"], "uid": f["uid"], "title": f["title"]} for f in self.folders]
        )

    async def create_folder(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body.get("title"), str) or set(body) - {"title", "uid", "parentUid"}:
            self.problems.append(f"POST /api/folders body {body}")
            return web.json_response({"message": "bad request"}, status=400)
        if any(f["title"] == body["title"] for f in self.folders):
            return web.json_response({"message": "folder exists"}, status=409)
        folder = {"id": len(self.folders) + 1, "uid": body.get("uid", "f"), "title": body["title"]}
        self.folders.append(folder)
        return web.json_response({**folder, "url": f"/dashboards/f/{folder['uid']}/", "version": 1})

    async def get_dashboard(self, request: web.Request) -> web.Response:
        stored = self.dashboards.get(request.match_info["uid"])
        if stored is None:
            return web.json_response({"message": "Dashboard not found"}, status=404)
        return web.json_response(stored)

    async def save_dashboard(self, request: web.Request) -> web.Response:
        body = await request.json()
        dashboard = body.get("dashboard")
        if (
            not isinstance(dashboard, dict)
            or not dashboard.get("uid")
            or not dashboard.get("title")
        ):
            self.problems.append(f"POST /api/dashboards/db without dashboard.uid/title: {body}")
            return web.json_response({"message": "bad request"}, status=400)
        if dashboard.get("id") is not None or body.get("overwrite") is not True:
            self.problems.append("POST /api/dashboards/db must send id null and overwrite true")
        folder_uid = body.get("folderUid", "")
        if folder_uid and folder_uid not in {f["uid"] for f in self.folders}:
            return web.json_response({"message": "folder not found"}, status=400)
        uid = dashboard["uid"]
        previous = self.dashboards.get(uid)
        version = previous["dashboard"]["version"] + 1 if previous else 1
        number = previous["dashboard"]["id"] if previous else len(self.dashboards) + 1
        self.dashboards[uid] = {
            "dashboard": {**dashboard, "id": number, "version": version},
            "meta": {"folderUid": folder_uid, "slug": uid, "version": version},
        }
        return web.json_response(
            {
                "id": number,
                "uid": uid,
                "url": f"/d/{uid}/{uid}",
                "status": "success",
                "version": version,
                "slug": uid,
            }
        )

    async def add_annotation(self, request: web.Request) -> web.Response:
        """``POST /api/annotations``: ``time``/``timeEnd`` epoch ms, ``tags`` [str], ``text``."""
        body = await request.json()
        allowed = {"dashboardUID", "dashboardId", "panelId", "time", "timeEnd", "tags", "text"}
        problems = []
        if set(body) - allowed:
            problems.append(f"unknown fields {sorted(set(body) - allowed)}")
        if not isinstance(body.get("text"), str) or not body["text"]:
            problems.append("text must be a non-empty string")
        if not isinstance(body.get("tags", []), list) or not all(
            isinstance(t, str) for t in body.get("tags", [])
        ):
            problems.append("tags must be a list of strings")
        for key in ("time", "timeEnd"):
            value = body.get(key)
            # epoch milliseconds: 2001..2286 (seconds would be ~1.7e9)
            if value is not None and not (isinstance(value, int) and 1e12 <= value < 1e13):
                problems.append(f"{key} must be epoch milliseconds (got {value!r})")
        time_, end = body.get("time"), body.get("timeEnd")
        if isinstance(time_, int) and isinstance(end, int) and end < time_:
            problems.append("timeEnd before time")
        if problems:
            self.problems.append(f"POST /api/annotations {body}: {'; '.join(problems)}")
            return web.json_response({"message": "bad request"}, status=400)
        self.annotations.append(body)
        return web.json_response({"message": "Annotation added", "id": len(self.annotations)})

    def texts(self, tag: str) -> list[str]:
        """Texts of the annotations carrying ``tag``, in arrival order."""
        return [a["text"] for a in self.annotations if tag in a.get("tags", [])]


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(fake.app)
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        fake.url = f"http://127.0.0.1:{port}"
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield fake
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    assert not fake.problems, fake.problems


@pytest.fixture
def silent_grafana() -> Iterator[str]:
    """URL of a "Grafana" that accepts connections and never answers (a hung server)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def _poll(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy, and return that; fail the test
    after ``timeout`` s, naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def stormwatch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``stormwatch(*args, columns=None)``: the CLI through :func:`stormwatch.cli.main` in
    this process (``columns``: the terminal width it sees, when given), with exit status and
    output as a process's; an exception ``main`` does not map escapes the test. For the
    cases about what a command says; keep one real process per command beside them."""
    from stormwatch.cli import main

    def run(*args: str, columns: int | None = None) -> subprocess.CompletedProcess[str]:
        if columns is not None:
            monkeypatch.setenv("COLUMNS", str(columns))
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            main(list(args))
        out = capsys.readouterr()
        code = exited.value.code
        return subprocess.CompletedProcess(
            args, code if isinstance(code, int) else 1, out.out, out.err
        )

    return run


@pytest.fixture(scope="session")
def wait_for() -> Callable[..., Any]:
    """``wait_for(predicate, timeout, what, interval=0.1)``: poll until ``predicate()`` is
    truthy and return its value; fail the test naming ``what`` after ``timeout`` s."""
    return _poll


@contextlib.contextmanager
def _prometheus(folder: Path, rules: list[dict[str, Any]]) -> Iterator[str]:
    """A real Prometheus on a free loopback port, evaluating ``rules`` (one group) every
    second and scraping itself; yields its URL once its API answers."""
    import yaml

    from stormwatch.clients import PrometheusAPIError, PrometheusClient

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "test", "rules": rules}]})
    )
    port = _free_tcp_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(folder / "rules.yml")],
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    with open(folder / "log", "w") as log:
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        client = PrometheusClient(url)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.query("vector(1)")
                break
            except PrometheusAPIError:
                pass
            assert proc.poll() is None, (folder / "log").read_text()
            assert time.monotonic() < deadline, "Prometheus did not answer"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def prometheus_with_rules() -> Callable[[Path, list[dict[str, Any]]], Any]:
    """``with prometheus_with_rules(folder, rules) as url``: a real Prometheus (the
    ``prometheus`` binary) evaluating ``rules`` every second, stopped at the end."""
    return _prometheus


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _quick_benchmark(
    script: str, tmp_path: Path, rows: tuple[str, ...], timeout: float
) -> tuple[str, dict[str, Any]]:
    """Run ``benchmarks/<script> --quick --json``; fail unless it exits 0 and prints every
    row of ``rows``. Returns its standard output and its figures (the JSON file)."""
    figures = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    missing = [row for row in rows if row not in done.stdout]
    assert not missing, f"rows missing from the output: {missing}\n{done.stdout[-4000:]}"
    return done.stdout, json.loads(figures.read_text())


@pytest.fixture(scope="session")
def quick_benchmark() -> Callable[..., tuple[str, dict[str, Any]]]:
    """``quick_benchmark(script, tmp_path, rows, timeout)``: run a benchmark's quick mode
    end to end, check its exit status and printed rows, return (stdout, figures)."""
    return _quick_benchmark


def _read_responder(lab: Any, what: str) -> list[dict[str, Any]]:
    from stormwatch.clients.responder import ResponderClient

    async def read() -> list[dict[str, Any]]:
        state = lab.state
        client = ResponderClient(
            state.responder_url, token_file=Path(state.responder_token_file), timeout=10
        )
        async with client:
            records = await getattr(client, what)()
        return [r.model_dump() for r in records]

    return asyncio.run(read())


@pytest.fixture(scope="session")
def lab_responder() -> Callable[[Any, str], list[dict[str, Any]]]:
    """``lab_responder(lab, "actions" | "incidents" | "notifications")``: the lab
    responder's records, as dicts, read through its client (``ResponderClient``)."""
    return _read_responder


_FAKE_AGENT = r"""
import json, os, signal, subprocess, sys, time
log, count, respawn = sys.argv[1], int(sys.argv[2]), sys.argv[4] == "1"
env_base = json.loads(sys.argv[3])
first = env_base.pop("_FIRST_RANK")
def note(what):
    with open(log, "a") as out:
        out.write(f"{what} {os.getpid()}\n")
signal.signal(signal.SIGTERM, lambda *_: note("agent-TERM"))
worker = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'a').write(f'worker-TERM {os.getpid()}\\n'))\n"
    "open(sys.argv[1], 'a').write(f'worker-ready {os.getpid()}\\n')\n"
    "while True: time.sleep(1)\n"
)
def start(rank):
    env = dict(os.environ, **env_base, RANK=str(first + rank), LOCAL_RANK=str(rank))
    return subprocess.Popen([sys.executable, "-c", worker, log], env=env)
children = [start(rank) for rank in range(count)]
print(" ".join(str(c.pid) for c in children), flush=True)
while True:
    time.sleep(0.1)
    if respawn:  # as torchrun does: a worker that died is started again
        children = [start(rank) if c.poll() is not None else c for rank, c in enumerate(children)]
"""


@dataclass
class FakeJob:
    """Stand-ins for one node's torchrun agent and its workers (real processes
    with a rank's environment; they note every SIGTERM in ``log`` and ignore it)."""

    agent: subprocess.Popen[bytes]
    worker_pids: list[int]
    log: Path

    def terms(self, who: str) -> int:
        if not self.log.exists():
            return 0
        return sum(line.startswith(f"{who}-TERM") for line in self.log.read_text().splitlines())

    def terms_ready(self) -> int:
        """Workers that installed their SIGTERM handler."""
        if not self.log.exists():
            return 0
        return sum(line.startswith("worker-ready") for line in self.log.read_text().splitlines())

    def kill(self) -> None:
        self.agent.kill()  # first: a respawning agent starts no worker after this
        ready = self.log.read_text().splitlines() if self.log.exists() else []
        started = [int(line.split()[1]) for line in ready if line.startswith("worker-ready")]
        for pid in {*self.worker_pids, *started}:
            with contextlib.suppress(psutil.Error):  # gone already: nothing to kill
                proc = psutil.Process(pid)
                if any("worker-ready" in arg for arg in proc.cmdline()):  # never a reused pid
                    proc.kill()
        self.agent.wait(10)
        if self.agent.stdout is not None:
            self.agent.stdout.close()


@pytest.fixture
def fake_job(tmp_path: Path) -> Iterator[Callable[..., FakeJob]]:
    """``fake_job(job, node_metrics_dir, workers=2, first_rank=0, respawn=False)`` ->
    :class:`FakeJob` (``respawn``: the agent starts a worker that died again, as torchrun)."""
    jobs: list[FakeJob] = []

    def start(
        job: str, metrics_dir: Path, workers: int = 2, first_rank: int = 0, respawn: bool = False
    ) -> FakeJob:
        log = tmp_path / f"{job}-{metrics_dir.name}-{len(jobs)}.signals"
        env = {
            "_FIRST_RANK": first_rank,
            "WORLD_SIZE": "4",
            "TORCHELASTIC_RUN_ID": f"run-{job}",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "STORMWATCH_JOB": job,
            "STORMWATCH_METRICS_DIR": str(metrics_dir),
        }
        agent = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _FAKE_AGENT,
                str(log),
                str(workers),
                json.dumps(env),
                "1" if respawn else "0",
            ],
            stdout=subprocess.PIPE,
        )
        assert agent.stdout is not None
        pids = [int(p) for p in agent.stdout.readline().split()]
        fake = FakeJob(agent, pids, log)
        jobs.append(fake)
        _poll(lambda: fake.terms_ready() == workers, 30, "fake workers ready")
        return fake

    yield start
    for fake in jobs:
        fake.kill()


@pytest.fixture(scope="session")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate (a CA too) for 127.0.0.1 / localhost and its key (PEM)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stormwatch-test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "server.crt", folder / "server.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


# --- A Slurm cluster with real daemons (munged, slurmctld, one slurmd per namespace) ---
#
# One set of fixtures for every module that needs one (tests/lab/test_slurm_cluster.py,
# tests/platforms/test_slurm_live.py). A module names its own bridge/namespace prefix and
# subnet so that two modules, a developer's lab (``sw*``, 10.213.0.0/24) and the lab tests
# (10.214.x.0/24) never share one:
#
#     SLURM_PREFIX = "swslt"      # + 2 random hex digits: bridge <p>br0, namespaces <p>-node<i>
#     SLURM_SUBNET = "10.215"     # a free 10.215.x.0/24
#     SLURM_NODES = 3             # node0..node2 at .10, .11, .12


def _slurm_module_setting(request: pytest.FixtureRequest, name: str, default: Any) -> Any:
    return getattr(request.module, name, default)


def _free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def slurm_network(request: pytest.FixtureRequest) -> Iterator[tuple[str, ipaddress.IPv4Network]]:
    """A bridge and ``SLURM_NODES`` namespaces of this module alone (``(prefix, subnet)``);
    removed afterwards, and checked gone. Skips without root or the Slurm programs."""
    import random

    from stormwatch.lab.errors import SlurmError
    from stormwatch.lab.netns import IpRoute2
    from stormwatch.lab.preflight import CAP_NET_ADMIN, CAP_SYS_ADMIN, effective_capabilities
    from stormwatch.lab.slurm.daemons import require_tools

    caps = effective_capabilities()
    if not (caps & (1 << CAP_NET_ADMIN) and caps & (1 << CAP_SYS_ADMIN)):
        pytest.skip("needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN): creates network namespaces")
    try:
        require_tools()
    except SlurmError as exc:
        pytest.skip(str(exc))
    nodes = _slurm_module_setting(request, "SLURM_NODES", 3)
    base = _slurm_module_setting(request, "SLURM_SUBNET", "10.215")
    net = IpRoute2()
    prefix = f"{_slurm_module_setting(request, 'SLURM_PREFIX', 'swslt')}{random.randrange(256):02x}"
    used = [iface.network for _, iface in net.addresses()]
    candidates = (ipaddress.IPv4Network(f"{base}.{random.randrange(256)}.0/24") for _ in range(100))
    subnet = next((c for c in candidates if not any(c.overlaps(u) for u in used)), None)
    if subnet is None:
        raise RuntimeError(f"no free {base}.x.0/24 subnet")
    bridge = f"{prefix}br0"
    try:
        net.add_bridge(bridge, ipaddress.IPv4Interface(f"{subnet[1]}/{subnet.prefixlen}"))
        for i in range(nodes):
            net.add_namespace(f"{prefix}-node{i}", {})
            net.add_node_link(
                netns=f"{prefix}-node{i}",
                veth=f"{prefix}v{i}",
                interface="eth0",
                bridge=bridge,
                address=ipaddress.IPv4Interface(f"{subnet[10 + i]}/{subnet.prefixlen}"),
                gateway=subnet[1],
            )
        yield prefix, subnet
    finally:
        for i in range(nodes):
            net.delete_namespace(f"{prefix}-node{i}")
            net.delete_link(f"{prefix}v{i}")
        net.delete_link(bridge)
    # Every cluster was stopped: nothing holds the namespaces, so they are gone.
    assert [n for n in net.namespaces() if n.startswith(prefix)] == []
    assert [n for n in net.links() if n.startswith(prefix)] == []


@pytest.fixture
def slurm_config(
    request: pytest.FixtureRequest, slurm_network: tuple[str, ipaddress.IPv4Network]
) -> Iterator[Any]:
    """A :class:`~stormwatch.lab.slurm.SlurmClusterConfig` over the module's namespaces (2
    stand-in GPUs a node), in a run directory munge can enter (pytest's own folders are
    0700, closed to the ``munge`` user)."""
    import shutil
    import tempfile

    from stormwatch.lab.slurm import SlurmClusterConfig, SlurmNode

    prefix, subnet = slurm_network
    run_dir = Path(tempfile.mkdtemp(prefix=f"{prefix}-run-"))
    run_dir.chmod(0o755)
    nodes = tuple(
        SlurmNode(name=f"node{i}", netns=f"{prefix}-node{i}", address=subnet[10 + i], gpus=2)
        for i in range(_slurm_module_setting(request, "SLURM_NODES", 3))
    )
    yield SlurmClusterConfig(
        run_dir=run_dir,
        nodes=nodes,
        controller_address=subnet[1],
        cluster_name=prefix,
        slurmctld_port=_free_tcp_port(),
        ready_timeout_s=20.0,
    )
    shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def slurm_cluster(slurm_config: Any) -> Iterator[Any]:
    """A started :class:`~stormwatch.lab.slurm.SlurmCluster`; stopped after the test."""
    from stormwatch.lab.slurm import SlurmCluster

    cluster = SlurmCluster(slurm_config)
    started = time.monotonic()
    ready_after = cluster.start()
    print(
        f"cold start to {len(slurm_config.nodes)} idle nodes: {ready_after:.2f} s "
        f"(start() {time.monotonic() - started:.2f} s)"
    )
    try:
        yield cluster
    finally:
        cluster.stop()


# --------------------------------------------------------------- Kubernetes schemas
#: Schemas of custom resources the tests validate (provenance in tests/schemas/README.md).
KUBE_SCHEMAS = Path(__file__).parent / "schemas"


def _strict(schema: Any) -> Any:
    """``schema`` refusing unknown fields wherever it lists them (kubeconform ``-strict``)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="session")
def kube_validate() -> Callable[[dict[str, Any]], None]:
    """Validate one Kubernetes object strictly (unknown fields fail); raises on a violation.

    Built-in kinds: ``kubernetes-validate`` against the OpenAPI schemas of its newest
    Kubernetes release. A JobSet (``jobset.x-k8s.io/v1alpha2``): the CRD's schema in
    tests/schemas/ (made strict), its ``metadata`` by the client's ``V1ObjectMeta``.
    """
    import jsonschema
    import kubernetes_validate
    from kubernetes import client as k8s

    version = kubernetes_validate.latest_version()
    jobset = _strict(
        json.loads((KUBE_SCHEMAS / "jobset.x-k8s.io_v1alpha2_jobset.json").read_text())
    )
    jobset_validator = jsonschema.Draft7Validator(jobset)

    def validate(obj: dict[str, Any]) -> None:
        if (obj.get("apiVersion"), obj.get("kind")) == ("jobset.x-k8s.io/v1alpha2", "JobSet"):
            jobset_validator.validate(obj)
            k8s.V1ObjectMeta.model_validate(obj.get("metadata") or {})
            return
        kubernetes_validate.validate(obj, version, strict=True)

    return validate
