"""Builders of the agent's subsystems, one per subsystem; :meth:`Agent.start` wires them.

Each builder makes one subsystem from the agent's settings and what it depends on,
starts it, and registers its cleanup on the agent's ``AsyncExitStack`` as soon as it
exists, so a failure half-way tears down only what was made, in reverse order:

* :func:`start_tracing`: the agent's own spans (first made, last closed);
* :func:`open_ledger`: the fault ledger (SQLite under the state dir);
* :func:`start_rank_watch` and :func:`start_rank_health`: the rank watcher (with the
  proc connector's exit source) and the hang / straggler monitor;
* :func:`open_gpu`: the NVML backend (real or simulated) and its sampler;
* :func:`start_fault_manager`: the fault API's manager (recovers the ledger; reverts
  what is applied on a clean stop, FC-13). Made after everything a fault acts on (the
  GPU backend, the rank watcher), so its shutdown revert runs while they are still open;
* :func:`build_collectors` and :func:`build_exposition`: the collectors and the
  cached ``/metrics`` exposition;
* :func:`listen` and :func:`run_in_background`: the HTTP listeners and the agent's
  background tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psutil
from aiohttp import web
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from stormwatch.agent import kube, textformat
from stormwatch.agent.collectors import (
    Collector,
    CollectorSet,
    FaultsCollector,
    GpuCollector,
    GpuProcessesCollector,
    HostCollector,
    NetworkCollector,
    NvlinkCollector,
    QdiscCollector,
    RanksCollector,
    RendezvousCollector,
    TrainerCollector,
    XidCollector,
)
from stormwatch.agent.collectors.info import InfoCollector
from stormwatch.agent.config import AgentConfig
from stormwatch.agent.errors import AgentConfigError, FaultsLeftApplied
from stormwatch.agent.exposition import MAX_EXPOSITION_AGE, ExpositionCache, LiveAges
from stormwatch.agent.faults import FaultLedger, FaultManager
from stormwatch.agent.gpu.backend import GpuBackend, NvmlApi, open_backend
from stormwatch.agent.gpu.fake import FakeNvml
from stormwatch.agent.gpu.sampler import GpuSampler, SamplerOptions
from stormwatch.agent.kube import PodAttribution
from stormwatch.agent.tracing import AgentTracing, TracingSettings
from stormwatch.agent.watch.detectors import HangSettings, StragglerSettings
from stormwatch.agent.watch.events import EventLog
from stormwatch.agent.watch.monitor import RankHealth
from stormwatch.agent.watch.orphans import OrphanInfo
from stormwatch.agent.watch.proc_exits import open_exit_source
from stormwatch.agent.watch.procs import is_torchrun_agent
from stormwatch.agent.watch.ranks import RankExit, RankWatcher
from stormwatch.faults import FaultContext, FaultError, SimulatedGpus
from stormwatch.faults.node import StopResult

log = logging.getLogger(__name__)

#: The collectors that need the GPU backend and its sampler.
GPU_COLLECTORS = ("gpu", "nvlink", "xid", "gpu_processes")
#: Longest wait (s) for requests still in flight when the agent stops (aiohttp's default is
#: 60 s): the agent's handlers answer in milliseconds, and a stop must fit in a pod's or a
#: systemd unit's stop timeout (Kubernetes' default grace period is 30 s).
SHUTDOWN_TIMEOUT_S = 5.0

Stack = contextlib.AsyncExitStack


class _Service(Protocol):
    """A background thread with a lifecycle (the rank watcher, the monitor, the sampler)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


ServiceT = TypeVar("ServiceT", bound=_Service)


def _started(stack: Stack, service: ServiceT) -> ServiceT:
    """``service``, started, its stop registered on ``stack``."""
    service.start()
    stack.callback(service.stop)
    return service


def start_tracing(cfg: AgentConfig, stack: Stack) -> AgentTracing:
    """The agent's spans, made in the running process (FC-07); closed last, after the
    shutdown reverts it records, within ``trace_flush_timeout`` (FC-08)."""
    tracing = AgentTracing(
        TracingSettings(
            node=cfg.node,
            trace_file=cfg.resolved_trace_file,
            otlp_endpoint=cfg.otlp_endpoint,
            flush_timeout=cfg.trace_flush_timeout,
        )
    )

    async def close() -> None:
        await asyncio.get_running_loop().run_in_executor(None, tracing.shutdown)

    stack.push_async_callback(close)
    return tracing


def open_ledger(cfg: AgentConfig, stack: Stack) -> FaultLedger:
    """The fault ledger, ``<state-dir>/faults.sqlite3``.

    Raises:
        LedgerError: it cannot be opened.
    """
    ledger = FaultLedger(Path(cfg.resolved_state_dir) / "faults.sqlite3")
    stack.callback(ledger.close)
    return ledger


def start_rank_watch(
    cfg: AgentConfig,
    stack: Stack,
    *,
    events: EventLog,
    tracer: trace.Tracer,
    clock: Callable[[], float],
) -> RankWatcher:
    """The rank watcher, scanning; each exit and each rank orphaned by its launcher's death
    that it notices is recorded in ``events``.

    Exit statuses come from the proc connector when the ``ranks`` collector is on.
    """
    exits = open_exit_source() if cfg.enabled("ranks") else None
    if exits is not None:
        stack.callback(exits.close)

    def on_exit(gone: RankExit) -> None:
        events.record(
            "rank_exit",
            gone.job,
            gone.rank,
            pid=gone.pid,
            clean=gone.clean,
            replaced=gone.replaced,
            exit_code=gone.exit_code,
            exit_signal=gone.exit_signal,
            reason=gone.reason,
        )

    def on_orphan(orphan: OrphanInfo) -> None:
        events.record(
            "rank_orphaned",
            orphan.job,
            orphan.rank,
            pid=orphan.pid,
            parent_pid=orphan.ppid,
            started_at=orphan.create_time,
        )

    watcher = RankWatcher(
        cfg.metrics_dir,
        interval=cfg.rank_scan_interval,
        forget_after=cfg.rank_retention_seconds,
        clock=clock,
        tracer=tracer,
        claim_unlabelled=cfg.claim_unlabelled_ranks,
        on_exit=on_exit,
        on_orphan=on_orphan,
        exits=exits,
    )
    return _started(stack, watcher)


def start_rank_health(
    cfg: AgentConfig,
    stack: Stack,
    *,
    watcher: RankWatcher,
    events: EventLog,
    clock: Callable[[], float],
) -> RankHealth:
    """The hang / straggler monitor of the watcher's ranks, evaluating."""
    health = RankHealth(
        watcher,
        cfg.metrics_dir,
        events,
        cfg.diagnostics_dir,
        hang=HangSettings(
            floor_seconds=cfg.hang_floor_seconds,
            factor=cfg.hang_factor,
            warmup_steps=cfg.hang_warmup_steps,
            warmup_seconds=cfg.hang_warmup_seconds,
        ),
        straggler=StragglerSettings(factor=cfg.straggler_factor, samples=cfg.straggler_samples),
        interval=cfg.rank_scan_interval,
        clock=clock,
    )
    return _started(stack, health)


def start_fault_manager(
    cfg: AgentConfig,
    stack: Stack,
    *,
    ledger: FaultLedger,
    watcher: RankWatcher,
    gpu: Callable[[], NvmlApi | None],
    tracer: trace.Tracer,
    clock: Callable[[], float],
) -> FaultManager:
    """The fault manager, its ledger recovered; on a clean stop it reverts every fault
    still applied (FC-13), then raises :class:`FaultsLeftApplied` if one stays applied.

    Call it after :func:`open_gpu` and :func:`start_rank_watch`: the stack unwinds in
    reverse, so the shutdown revert runs while NVML and the watcher are still open.

    Args:
        gpu: the open NVML backend, if any (GPU faults act on it).
    """

    def simulated_gpus() -> SimulatedGpus | None:
        api = gpu()
        return api if isinstance(api, FakeNvml) else None

    faults = FaultManager(
        ledger,
        FaultContext(
            node=cfg.node,
            ranks=watcher,
            is_launcher=is_torchrun_agent,
            metrics_dir=Path(cfg.metrics_dir),
            state_dir=Path(cfg.resolved_state_dir),
            gpu=gpu,
            simulated_gpus=simulated_gpus,
            stop_processes=_stop_processes,
        ),
        clock=clock,
        tracer=tracer,
    )
    faults.recover()

    async def revert_on_shutdown() -> None:
        loop = asyncio.get_running_loop()
        failures: list[tuple[str, str]] = []
        for record in await loop.run_in_executor(None, faults.ledger.active):
            try:
                await loop.run_in_executor(None, _revert_at_shutdown, faults, record.id)
            except FaultError as exc:
                failures.append((record.id, str(exc)))
                log.error(
                    "fault %s not reverted at shutdown (the next start retries): %s", record.id, exc
                )
        if failures:
            raise FaultsLeftApplied(failures)

    stack.push_async_callback(revert_on_shutdown)
    return faults


def _revert_at_shutdown(faults: FaultManager, fault_id: str) -> None:
    faults.revert(fault_id, reason="shutdown")


@dataclasses.dataclass(frozen=True)
class GpuSide:
    """The open GPU backend and the sampler reading it."""

    backend: GpuBackend
    sampler: GpuSampler


def open_gpu(
    cfg: AgentConfig,
    stack: Stack,
    *,
    fake: FakeNvml | None,
    clock: Callable[[], float],
) -> GpuSide | None:
    """The NVML backend and its sampler, sampling; None when every GPU collector is off.

    Raises:
        NvmlUnavailable: ``gpu_backend=nvml`` without a driver.
    """
    if not any(cfg.enabled(name) for name in GPU_COLLECTORS):
        return None
    backend = stack.enter_context(open_backend(cfg.gpu_backend, sim_gpus=cfg.sim_gpus, fake=fake))
    sampler = GpuSampler(
        backend.api,
        SamplerOptions(
            interval=cfg.sample_interval,
            nvlink=cfg.enabled("nvlink"),
            processes=cfg.enabled("gpu_processes"),
            xid=cfg.enabled("xid"),
        ),
        clock=clock,
    )
    return GpuSide(backend, _started(stack, sampler))


def build_collectors(
    cfg: AgentConfig,
    *,
    sampler: GpuSampler | None,
    watcher: RankWatcher,
    health: RankHealth,
    ledger: FaultLedger,
    clock: Callable[[], float],
) -> list[Collector]:
    """The enabled collectors, GPU ones first, in :data:`GPU_COLLECTORS` order."""
    collectors: list[Collector] = []
    if sampler is not None:
        pods = (
            None
            if cfg.pod_resources_socket is None
            else PodAttribution(kube.KubeletPodResources(cfg.pod_resources_socket))  # imports gRPC
        )
        builders: dict[str, Callable[[], Collector]] = {
            "gpu": lambda: GpuCollector(
                sampler,
                hostname=cfg.node,
                pods=pods,
                clock=clock,
                events_window_seconds=cfg.clock_events_window_seconds,
                xid_window_seconds=cfg.xid_window_seconds if cfg.enabled("xid") else None,
                export_age=False,
            ),
            "nvlink": lambda: NvlinkCollector(sampler, hostname=cfg.node, pods=pods),
            "xid": lambda: XidCollector(
                sampler,
                hostname=cfg.node,
                pods=pods,
                window_seconds=cfg.xid_window_seconds,
                clock=clock,
            ),
            "gpu_processes": lambda: GpuProcessesCollector(
                sampler, rank_of_pid=watcher.rank_of_pid
            ),
        }
        collectors.extend(builders[name]() for name in GPU_COLLECTORS if cfg.enabled(name))
    if cfg.enabled("host"):
        collectors.append(HostCollector())
    if cfg.enabled("network"):
        collectors.append(NetworkCollector())
    if cfg.enabled("qdisc"):
        collectors.append(QdiscCollector())
    if cfg.enabled("ranks"):
        collectors.append(RanksCollector(watcher, clock=clock, health=health, export_age=False))
    if cfg.enabled("trainer"):
        collectors.append(TrainerCollector(watcher.folder))
    if cfg.enabled("faults"):
        collectors.append(FaultsCollector(ledger))
    if cfg.enabled("rendezvous"):
        live = lambda: [(r.job, r.pid) for r in watcher.ranks() if r.alive]  # noqa: E731
        collectors.append(RendezvousCollector(live, interval=cfg.rendezvous_probe_interval))
    return collectors


@dataclasses.dataclass(frozen=True)
class Exposition:
    """What ``/metrics`` serves.

    Attributes:
        collectors: the collectors, isolated from each other (``collector_up``).
        registry: the agent's info and every collector (uncached rendering).
        cache: the cached exposition ``/metrics`` serves.
    """

    collectors: CollectorSet
    registry: CollectorRegistry
    cache: ExpositionCache


def build_exposition(
    cfg: AgentConfig,
    collectors: list[Collector],
    *,
    gpu_backend: str,
    tracing: AgentTracing,
    sampler: GpuSampler | None,
    watcher: RankWatcher,
    clock: Callable[[], float],
) -> Exposition:
    """The collector set, the registry and the cached exposition, re-rendered when a rank
    appears or goes (the watcher's listener) and at least every ``sample_interval``."""
    collector_set = CollectorSet(collectors, tracer=tracing.tracer)
    info = InfoCollector(cfg.node, gpu_backend, tracing.counts)
    info_registry = CollectorRegistry(auto_describe=False)
    info_registry.register(info)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(info)
    registry.register(collector_set)

    def render(openmetrics_format: bool) -> bytes:
        info_text = textformat.render(
            info_registry.collect(), openmetrics_format=openmetrics_format
        )
        return info_text + collector_set.render(openmetrics_format=openmetrics_format)

    cache = ExpositionCache(
        render,
        live=LiveAges(
            sampler if cfg.enabled("gpu") else None,
            watcher if cfg.enabled("ranks") else None,
            clock=clock,
        ),
        sampler=sampler,
        period=min(cfg.sample_interval, MAX_EXPOSITION_AGE),
        forget=collector_set.forget_format,
    )
    watcher.add_listener(cache.changed)
    return Exposition(collector_set, registry, cache)


async def listen(
    stack: Stack,
    app: web.Application,
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
    *,
    what: str = "listen (--listen)",
) -> str:
    """Serve ``app`` on ``host:port``; return its base URL (``https`` with TLS).

    Raises:
        AgentConfigError: the address cannot be bound (taken, not local).
    """
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S
    )
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    try:
        await site.start()
    except OSError as exc:
        raise AgentConfigError(f"{what}: cannot listen on {host}:{port}: {exc.strerror}") from exc
    bound, bound_port = runner.addresses[0][:2]
    scheme = "https" if tls is not None else "http"
    return f"{scheme}://{'[' + bound + ']' if ':' in bound else bound}:{bound_port}"


async def run_in_background(stack: Stack, work: Coroutine[Any, Any, None], name: str) -> None:
    """Run ``work`` as a task, cancelled when the agent stops."""
    task = asyncio.create_task(work, name=name)

    async def cancel() -> None:
        task.cancel()
        # The task was cancelled on purpose: its CancelledError is the expected end.
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(cancel)


def _stop_processes(procs: Iterable[psutil.Process], *, grace_s: float) -> StopResult:
    """:func:`stormwatch.platforms.stopping.stop_processes`, imported when a fault stops
    processes: the platforms package (the lab, Slurm) is not the agent's to load."""
    from stormwatch.platforms.stopping import stop_processes

    return stop_processes(procs, grace_s=grace_s)


__all__ = [
    "GPU_COLLECTORS",
    "Exposition",
    "GpuSide",
    "build_collectors",
    "build_exposition",
    "listen",
    "open_gpu",
    "open_ledger",
    "run_in_background",
    "start_fault_manager",
    "start_rank_health",
    "start_rank_watch",
    "start_tracing",
]
