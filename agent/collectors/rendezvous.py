"""``rendezvous`` collector: whether this node reaches each local job's rendezvous store.

A job's ranks train without the rendezvous (c10d) store: they talk to each other, and
torchrun needs the store only to start or restart the worker group. A node cut off from
the store (a firewall change, a store host's port overloaded) therefore trains on,
unnoticed, until the next failure, when its restart cannot rendezvous and the whole job
waits for the rendezvous timeout (torchrun's ``join_timeout``, 600 s). This collector
probes the store from the node while the job is healthy (issue 18, the game day's
04-rdzv-store-isolation):

* the endpoint of each job with a live rank here: the ``--rdzv-endpoint`` of the
  rank's torchrun, else its ``--master-addr``/``--master-port``, else the rank's
  ``MASTER_ADDR``/``MASTER_PORT`` (a launch without torchrun); loopback endpoints
  (a single-node job) are not probed. A job stays probed while that torchrun runs,
  ranks or not (after a failure, its restart is what needs the store);
* every ``interval`` seconds, a TCP connect with ``timeout`` (asyncio, no thread),
  closed at once, sending nothing. The store's host *answered* when the connect
  succeeded or was refused (the host is reachable; nothing listens: the store is gone,
  as at the end of a job); it did *not* when the connect timed out or the network
  said the host is unreachable (a drop, a partition, no route);
* ``stormwatch_rendezvous_store_reachable{training_job,endpoint}`` (1/0) and
  ``stormwatch_rendezvous_store_probe_duration_seconds`` (the last connect's time),
  for the jobs that still have a live rank here; ``StormwatchRendezvousStoreUnreachable``
  (alerts/rules/network.yml) fires on the first.

Cost: one TCP connection per job and interval from each node to the store's host; at N
nodes that is N / ``interval`` accepts per second on a store that also serves the job's
rendezvous: raise ``--rendezvous-probe-interval`` for large jobs (1,000 nodes at 10 s:
100 per second). PyTorch's TCPStore logs nothing for a connection that sends nothing,
except where it cannot resolve the client's address (the lab's namespaces: one warning
per probe in the store host's torchrun log).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

import psutil
from prometheus_client.core import Metric

from stormwatch.agent.collectors.base import new_family
from stormwatch.contracts.rank_env import is_torchrun_agent
from stormwatch.faults.system import store_endpoint

log = logging.getLogger(__name__)

#: Seconds between probes of each endpoint (``--rendezvous-probe-interval``).
DEFAULT_INTERVAL_S = 1.0
#: Seconds a connect may take before the store counts as unreachable: one SYN
#: retransmission (Linux's first after 1 s) within it would make it 1 s + RTT.
DEFAULT_TIMEOUT_S = 1.0
#: The connect errors that say the network cannot reach the host (no answer from it).
UNREACHABLE_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT})

Endpoint = tuple[str, int]


def _parse(host: str | None, port: str | None) -> Endpoint | None:
    if not host or not port or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    host = host.strip("[]")
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        if host == "localhost":
            return None
    return host, int(port)


def launcher_endpoint(cmdline: Sequence[str]) -> Endpoint | None:
    """The store a torchrun command line names (:func:`~stormwatch.faults.system.store_endpoint`:
    ``--rdzv-endpoint``, else ``--master-addr``/``--master-port``); None for none, a
    malformed one, or a loopback host."""
    endpoint = store_endpoint(cmdline)
    return None if endpoint is None else _parse(endpoint[0], str(endpoint[1]))


class Launcher(Protocol):
    """What the collector needs of a rank's launcher process (a :class:`psutil.Process`)."""

    def is_running(self) -> bool: ...


def rank_store(pid: int) -> tuple[Endpoint | None, Launcher | None]:
    """The store of the rank ``pid`` and its torchrun: the torchrun's endpoint
    (:func:`launcher_endpoint`), else the rank's own ``MASTER_ADDR``/``MASTER_PORT`` (no
    launcher); ``(None, None)`` when neither names one, or the rank is gone."""
    try:
        process = psutil.Process(pid)
        for parent in process.parents():
            with contextlib.suppress(psutil.Error):  # an ancestor gone or not ours: the next
                cmdline = parent.cmdline()
                if is_torchrun_agent(parent.name(), cmdline):
                    return launcher_endpoint(cmdline), parent
        environ = process.environ()
    except psutil.Error:
        return None, None
    return _parse(environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")), None


async def probe(endpoint: Endpoint, timeout: float) -> bool:
    """Whether ``endpoint``'s host answered a TCP connect within ``timeout`` s (connected,
    or refused); False on a timeout, an unreachable host or network, or a name that does
    not resolve."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*endpoint), timeout)
    except ConnectionRefusedError:
        return True
    except TimeoutError:
        return False
    except OSError as exc:  # unreachable host or network, a name that does not resolve
        if exc.errno not in UNREACHABLE_ERRNOS:
            log.debug("rendezvous probe of %s:%d: %s", *endpoint, exc)
        return False
    writer.close()
    with contextlib.suppress(OSError):  # the connect answered: how the close ends is moot
        await writer.wait_closed()
    return True


class RendezvousCollector:
    """Probes the rendezvous stores of the node's jobs (module docstring).

    A job is probed while a rank of it runs on the node, and while the torchrun that
    launched its last rank here runs: between a failure and the restart its torchrun is
    what needs the store (the restart's rendezvous), and no rank runs.

    Args:
        live_ranks: ``() -> [(job, pid)]`` of the ranks running on this node (the rank
            watcher's).
        interval: seconds between probes (> 0).
        timeout: seconds a connect may take (> 0).
        store_of: a rank's store and launcher (:func:`rank_store`; tests pass theirs).
        clock: monotonic seconds.
    """

    name = "rendezvous"

    def __init__(
        self,
        live_ranks: Callable[[], Iterable[tuple[str, int]]],
        *,
        interval: float = DEFAULT_INTERVAL_S,
        timeout: float = DEFAULT_TIMEOUT_S,
        store_of: Callable[[int], tuple[Endpoint | None, Launcher | None]] = rank_store,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError(f"interval and timeout: must be > 0 s (got {interval}, {timeout})")
        self._live_ranks = live_ranks
        self._interval = interval
        self._timeout = timeout
        self._store_of = store_of
        self._clock = clock
        self._endpoints: dict[int, Endpoint | None] = {}  # rank pid -> its store
        self._launchers: dict[str, tuple[Launcher, Endpoint]] = {}  # job -> its torchrun here
        self._lock = threading.Lock()
        self._results: dict[tuple[str, Endpoint], tuple[bool, float]] = {}

    def _jobs(self) -> dict[str, Endpoint]:
        """Each job's store: of its first live rank that names one (pids cached), else of
        its torchrun here while that runs."""
        live = list(self._live_ranks())
        pids = {pid for _, pid in live}
        for pid in set(self._endpoints) - pids:
            del self._endpoints[pid]
        stores: dict[str, Endpoint] = {}
        for job, pid in sorted(live):
            if pid not in self._endpoints:
                endpoint, launcher = self._store_of(pid)
                self._endpoints[pid] = endpoint
                if endpoint is not None and launcher is not None:
                    self._launchers[job] = (launcher, endpoint)
            endpoint = self._endpoints[pid]
            if endpoint is not None:
                stores.setdefault(job, endpoint)
        for job, (launcher, endpoint) in list(self._launchers.items()):
            if job in stores:
                continue
            with contextlib.suppress(psutil.Error):  # gone: forgotten below
                if launcher.is_running():
                    stores[job] = endpoint
                    continue
            del self._launchers[job]
        return stores

    async def probe_once(self) -> None:
        """Probe every live job's store once, side by side; forget the jobs gone."""
        stores = await asyncio.to_thread(self._jobs)
        targets = sorted(set(stores.values()))
        started = self._clock()
        answers = await asyncio.gather(*(self._timed(t) for t in targets))
        results = dict(zip(targets, answers, strict=True))
        with self._lock:
            self._results = {(job, ep): results[ep] for job, ep in stores.items()}
        log.debug(
            "rendezvous probes of %d store(s) took %.3f s", len(targets), self._clock() - started
        )

    async def _timed(self, endpoint: Endpoint) -> tuple[bool, float]:
        started = self._clock()
        answered = await probe(endpoint, self._timeout)
        return answered, self._clock() - started

    async def run(self) -> None:
        """Probe every ``interval`` seconds (start to start) until cancelled."""
        while True:
            started = self._clock()
            try:
                await self.probe_once()
            except Exception:  # a bug must not end the probing; the series go stale
                log.exception("rendezvous probe failed")
            await asyncio.sleep(max(0.0, self._interval - (self._clock() - started)))

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            results = dict(self._results)
        reachable = new_family("stormwatch_rendezvous_store_reachable")
        duration = new_family("stormwatch_rendezvous_store_probe_duration_seconds")
        for (job, (host, port)), (answered, seconds) in sorted(results.items()):
            labels = [job, f"{host}:{port}"]
            reachable.add_metric(labels, 1.0 if answered else 0.0)
            duration.add_metric(labels, seconds)
        yield reachable
        yield duration


__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_TIMEOUT_S",
    "Launcher",
    "RendezvousCollector",
    "launcher_endpoint",
    "probe",
    "rank_store",
]
