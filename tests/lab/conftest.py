"""Fixtures of the lab tests: isolated lab configurations and a "nothing left behind" check.

Every lab a test starts gets its own run directory, name prefix, subnet and
loopback ports, so the tests neither collide with each other nor with a
developer's lab (prefix ``sw``, 10.213.0.0/24, ports 19090/19093/19095).
"""

from __future__ import annotations

import ipaddress
import random
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from stormwatch.lab import Lab, LabConfig
from stormwatch.lab.netns import NETNS_ETC, IpRoute2
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.preflight import CAP_NET_ADMIN, CAP_SYS_ADMIN, effective_capabilities
from stormwatch.lab.services.procs import LAB_MARKER_ENV
from stormwatch.lab.state import StateStore

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))


def _privileged() -> bool:
    caps = effective_capabilities()
    return bool(caps & (1 << CAP_NET_ADMIN) and caps & (1 << CAP_SYS_ADMIN))


def _missing_tools() -> list[str]:
    wanted = ("ip", "prometheus", "prometheus-alertmanager", "promtool")
    return [tool for tool in wanted if shutil.which(tool) is None]


def skip_unless_lab_possible() -> None:
    """Skip (with the reason) unless this process may build a lab."""
    if not _privileged():
        pytest.skip("needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN): creates network namespaces")
    missing = _missing_tools()
    if missing:
        pytest.skip(f"needs {', '.join(missing)} installed")


@pytest.fixture(autouse=True)
def _skip_without_privileges(request: pytest.FixtureRequest) -> None:
    """Tests marked ``root`` need namespaces and the Prometheus binaries; skip clearly otherwise."""
    if request.node.get_closest_marker("root") is not None:
        skip_unless_lab_possible()


@pytest.fixture(scope="session")
def lab_possible() -> None:
    """For module-scoped lab fixtures (set up before the autouse check runs)."""
    skip_unless_lab_possible()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_subnet() -> ipaddress.IPv4Network:
    used = [iface.network for _, iface in IpRoute2().addresses()] if shutil.which("ip") else []
    for _ in range(100):
        candidate = ipaddress.IPv4Network(f"10.214.{random.randrange(256)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError("no free 10.214.x.0/24 subnet")


def new_lab_config() -> LabConfig:
    """A lab configuration no other lab on this machine uses."""
    ports: set[int] = set()
    while len(ports) < 4:
        ports.add(free_port())
    prometheus, alertmanager, responder, slurmctld = sorted(ports)
    return LabConfig(
        slurmctld_port=slurmctld,
        prefix=f"swt{random.randrange(16**4):04x}",
        subnet=_free_subnet(),
        prometheus_port=prometheus,
        alertmanager_port=alertmanager,
        responder_port=responder,
        startup_timeout=60.0,
    )


@pytest.fixture
def lab_config() -> LabConfig:
    """A lab configuration no other lab on this machine uses."""
    return new_lab_config()


@pytest.fixture(scope="session")
def lab_config_factory() -> Callable[[], LabConfig]:
    """``lab_config_factory()``: a fresh isolated configuration (for module-scoped labs)."""
    return new_lab_config


def config_args(config: LabConfig) -> list[str]:
    """``stormwatch lab up/down`` options that select ``config``."""
    return [
        "--prefix",
        config.prefix,
        "--subnet",
        str(config.subnet),
        "--prometheus-port",
        str(config.prometheus_port),
        "--alertmanager-port",
        str(config.alertmanager_port),
        "--responder-port",
        str(config.responder_port),
        "--slurmctld-port",
        str(config.slurmctld_port),
    ]


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run ``stormwatch ARGS`` and capture its output."""
    return subprocess.run(
        [STORMWATCH, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def leftovers(config: LabConfig, run_dir: Path) -> list[str]:
    """Everything of the lab ``config`` in ``run_dir`` that still exists."""
    network = IpRoute2()
    found = [f"netns {n}" for n in network.namespaces() if config.owns_netns(n)]
    found += [f"link {n}" for n in network.links() if config.owns_link(n)]
    found += [
        f"{NETNS_ETC / config.netns(i)}"
        for i in range(config.nodes)
        if (NETNS_ETC / config.netns(i)).exists()
    ]
    wanted = str(RunPaths.of(run_dir).run_dir)
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(LAB_MARKER_ENV) == wanted and proc.status() != "zombie":
                found.append(f"process {proc.pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.Error:
            continue
    state = StateStore(RunPaths.of(run_dir)).load()
    if state is not None:
        records = list(state.processes.values())
        records += [p for job in state.jobs.values() for p in job.processes.values()]
        for record in records:
            for pid in (record.pid, record.supervisor_pid):
                try:
                    proc = psutil.Process(pid)
                    if proc.status() != "zombie" and proc.create_time() in (
                        record.create_time,
                        record.supervisor_create_time,
                    ):
                        found.append(f"recorded process {record.name} pid {pid}")
                except psutil.Error:
                    continue
    return found


@pytest.fixture(scope="session")
def nothing_left() -> Callable[[LabConfig, Path], list[str]]:
    """``nothing_left(config, run_dir)``: what of that lab still exists (should be [])."""
    return leftovers


@pytest.fixture(name="run_cli")
def run_cli_fixture() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_cli(*args)``: run ``stormwatch ARGS``, capturing output."""
    return run_cli


@pytest.fixture(name="config_args")
def config_args_fixture() -> Callable[[LabConfig], list[str]]:
    """``config_args(config)``: the ``lab up/down`` options selecting ``config``."""
    return config_args


@pytest.fixture
def cleanup_lab() -> Iterator[Callable[[LabConfig, Path], None]]:
    """Register a lab for a last-resort ``lab down`` (so a failed test leaves nothing)."""
    registered: list[tuple[LabConfig, Path]] = []

    def register(config: LabConfig, run_dir: Path) -> None:
        registered.append((config, run_dir))

    yield register
    for config, run_dir in registered:
        if leftovers(config, run_dir):
            run_cli("lab", "down", "--run-dir", str(run_dir), *config_args(config))


@pytest.fixture(scope="module")
def lab(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    lab_config_factory: Callable[[], LabConfig],
    lab_possible: None,
    nothing_left: Callable[[LabConfig, Path], list[str]],
) -> Iterator[Lab]:
    """One lab (own prefix, subnet, ports) shared by a module's tests, torn down after
    them with the "nothing left behind" check. Its shape is the default lab's (3 nodes x 2
    ranks) unless the module sets ``LAB_SHAPE``, :class:`LabConfig` fields such as
    ``{"nodes": 2, "nproc_per_node": 1}``."""
    shape = getattr(request.module, "LAB_SHAPE", {})
    config = LabConfig.model_validate({**lab_config_factory().model_dump(), **shape})
    the_lab = Lab(tmp_path_factory.mktemp("lab"))
    try:
        the_lab.up(config)
        yield the_lab
    finally:
        the_lab.down(config)
        assert nothing_left(config, the_lab.run_dir) == []
