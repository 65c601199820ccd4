"""The rendezvous-store probe (issue 18: a node cut off from the store is seen while the
job still trains, not at its next restart). Real sockets on loopback: a listener, a
closed port (refused: the host answered) and a listener whose accept queue is full (the
kernel drops the SYN: what a firewall DROP or a partition looks like to the prober); real
processes for the endpoint's discovery."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stormwatch.agent.collectors.rendezvous import (
    RendezvousCollector,
    launcher_endpoint,
    probe,
    rank_store,
)
from stormwatch.agent.config import AgentConfig


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


@pytest.fixture
def refusing() -> int:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return int(closed.getsockname()[1])


@pytest.fixture
def dropping() -> Iterator[int]:
    """A port whose SYNs are dropped: its accept queue (backlog 0) is full."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = []
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):  # connecting, in the background
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.2)
        yield port
        for filler in fillers:
            filler.close()


def test_a_store_that_accepts_or_refuses_answered_and_one_that_drops_did_not(
    listening: int, refusing: int, dropping: int
) -> None:
    assert asyncio.run(probe(("127.0.0.1", listening), 1.0)) is True
    assert asyncio.run(probe(("127.0.0.1", refusing), 1.0)) is True  # the store is gone
    started = time.monotonic()
    assert asyncio.run(probe(("127.0.0.1", dropping), 0.5)) is False
    assert 0.4 < time.monotonic() - started < 2.0
    assert asyncio.run(probe(("no-such-host.invalid", listening), 1.0)) is False


class _Launcher:
    def __init__(self) -> None:
        self.running = True

    def is_running(self) -> bool:
        return self.running


def _probe(collector: RendezvousCollector) -> dict[tuple[str, str], float]:
    asyncio.run(collector.probe_once())
    [reachable, _] = list(collector.collect())
    return {(s.labels["training_job"], s.labels["endpoint"]): s.value for s in reachable.samples}


def test_the_collector_exports_each_live_jobs_store_and_forgets_a_job_gone(
    listening: int, dropping: int
) -> None:
    live = [("a", 101), ("a", 102), ("b", 201)]
    stores = {101: ("127.0.0.1", listening), 102: None, 201: ("127.0.0.1", dropping)}
    looked_up: list[int] = []

    def store_of(pid: int) -> tuple[tuple[str, int] | None, None]:
        looked_up.append(pid)
        return stores[pid], None  # no torchrun: MASTER_ADDR/MASTER_PORT

    collector = RendezvousCollector(lambda: live, timeout=0.5, store_of=store_of)
    asyncio.run(collector.probe_once())
    families = {f.name: f for f in collector.collect()}
    reachable = {
        (s.labels["training_job"], s.labels["endpoint"]): s.value
        for s in families["stormwatch_rendezvous_store_reachable"].samples
    }
    assert reachable == {
        ("a", f"127.0.0.1:{listening}"): 1.0,
        ("b", f"127.0.0.1:{dropping}"): 0.0,
    }
    durations = {
        s.labels["training_job"]: s.value
        for s in families["stormwatch_rendezvous_store_probe_duration_seconds"].samples
    }
    assert durations["a"] < 0.5 <= durations["b"] < 1.5
    live[:] = [("a", 101)]
    assert list(_probe(collector)) == [("a", f"127.0.0.1:{listening}")]
    assert sorted(looked_up) == [101, 102, 201]  # each pid looked up once


def test_a_job_between_a_failure_and_its_restart_is_probed_while_its_torchrun_runs(
    dropping: int,
) -> None:
    """04-rdzv-store-isolation: node1 cut off from the store, then rank 3 killed: its
    torchrun stops rank 2 and waits to rendezvous, so no rank of the job runs on node1,
    and the store must still be probed (the restart is what needs it)."""
    launcher = _Launcher()
    live = [("j", 301)]
    store = ("127.0.0.1", dropping)
    collector = RendezvousCollector(
        lambda: live, timeout=0.3, store_of=lambda pid: (store, launcher)
    )
    assert _probe(collector) == {("j", f"127.0.0.1:{dropping}"): 0.0}
    live[:] = []  # the ranks are gone; torchrun waits at the rendezvous
    assert _probe(collector) == {("j", f"127.0.0.1:{dropping}"): 0.0}
    launcher.running = False  # the job is over on this node
    assert _probe(collector) == {}


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (["torchrun", "--rdzv-endpoint", "10.0.0.1:29400", "train.py"], ("10.0.0.1", 29400)),
        (["torchrun", "--rdzv_endpoint=node0:29500", "x"], ("node0", 29500)),
        (["torchrun", "--master-addr", "10.0.0.2", "--master-port", "29501"], ("10.0.0.2", 29501)),
        (["torchrun", "--rdzv-endpoint", "[fd00::1]:29400"], ("fd00::1", 29400)),
        (["torchrun", "--rdzv-endpoint", "127.0.0.1:29400"], None),  # single node
        (["torchrun", "--rdzv-endpoint", "localhost:29400"], None),
        (["torchrun", "--rdzv-endpoint", "10.0.0.1"], None),  # no port
        (["torchrun", "--rdzv-endpoint", "10.0.0.1:99999"], None),
        (["torchrun", "--standalone", "train.py"], None),
    ],
)
def test_the_store_a_torchrun_command_line_names(
    cmdline: list[str], expected: tuple[str, int] | None
) -> None:
    assert launcher_endpoint(cmdline) == expected


def test_a_ranks_store_is_its_torchruns_else_its_own_environment(tmp_path: Path) -> None:
    launcher = tmp_path / "torchrun"  # a launcher by name, as torchrun is
    launcher.write_text(
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "child.wait()\n"
    )
    under_torchrun = subprocess.Popen(
        [sys.executable, str(launcher), "--rdzv-endpoint", "10.1.2.3:29400"],
        stdout=subprocess.PIPE,
        text=True,
    )
    alone = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "1234"},
    )
    rank = None
    try:
        assert under_torchrun.stdout is not None
        rank = int(under_torchrun.stdout.readline())
        endpoint, launcher = rank_store(rank)
        assert endpoint == ("10.1.2.3", 29400)
        assert launcher is not None and launcher.is_running()
        assert rank_store(alone.pid) == (("10.9.9.9", 1234), None)
    finally:
        if rank is not None:  # the launcher's child: killing the launcher leaves it running
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGKILL)
        for process in (under_torchrun, alone):
            process.kill()
            process.wait()
        if under_torchrun.stdout is not None:
            under_torchrun.stdout.close()
    assert rank_store(alone.pid) == (None, None)  # gone
    assert not launcher.is_running()


def test_the_probe_interval_is_validated_and_the_collector_can_be_switched_off(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="rendezvous_probe_interval"):
        AgentConfig(node="n0", metrics_dir=tmp_path, rendezvous_probe_interval=0)
    config = AgentConfig(
        node="n0", metrics_dir=tmp_path, disabled_collectors=frozenset({"rendezvous"})
    )
    assert not config.enabled("rendezvous")
    with pytest.raises(ValueError, match="interval and timeout"):
        RendezvousCollector(list, interval=0)
