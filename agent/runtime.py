"""The agent process: wires config, NVML, rank watcher, collectors, ledger and HTTP together.

Everything is created in :meth:`Agent.start` and registers its cleanup on one
``AsyncExitStack`` as it is created, so a failure half-way tears down only what
exists, and :meth:`Agent.stop` undoes it all in reverse order. Signals are the
caller's business (the CLI maps SIGTERM/SIGINT to :meth:`Agent.stop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

import stormwatch
from stormwatch.agent.collectors import (
    Collector,
    CollectorSet,
    FaultsCollector,
    GpuCollector,
    GpuProcessesCollector,
    HostCollector,
    NvlinkCollector,
    RanksCollector,
    TrainerCollector,
    XidCollector,
    new_family,
)
from stormwatch.agent.config import AgentConfig
from stormwatch.agent.errors import AgentConfigError
from stormwatch.agent.exposition import MAX_EXPOSITION_AGE, ExpositionCache, LiveAges
from stormwatch.agent.faults import FaultLedger, FaultManager
from stormwatch.agent.gpu.backend import NvmlApi, open_backend
from stormwatch.agent.gpu.fake import FakeNvml
from stormwatch.agent.gpu.sampler import GpuSampler, SamplerOptions
from stormwatch.agent.server import ApiDeps, build_app, build_fault_app
from stormwatch.agent.statelock import StateDirLock
from stormwatch.agent.tracing import AgentTracing, TracingSettings
from stormwatch.agent.watch.detectors import HangSettings, StragglerSettings
from stormwatch.agent.watch.events import EventLog
from stormwatch.agent.watch.monitor import RankHealth
from stormwatch.agent.watch.proc_exits import open_exit_source
from stormwatch.agent.watch.procs import is_torchrun_agent
from stormwatch.agent.watch.ranks import RankExit, RankWatcher
from stormwatch.agent.webconfig import BasicAuth, load_web_config, server_ssl_context
from stormwatch.faults import FaultContext, FaultError, SimulatedGpus

log = logging.getLogger(__name__)

#: Seconds between TTL checks of the fault ledger.
EXPIRY_PERIOD = 0.25
_GPU_COLLECTORS = ("gpu", "nvlink", "xid", "gpu_processes")


class _InfoCollector:
    def __init__(self, node: str, backend: str, tracing: AgentTracing) -> None:
        self._node, self._backend, self._tracing = node, backend, tracing

    def collect(self) -> Iterator[Metric]:
        info = new_family("stormwatch_agent_info")
        info.add_metric([self._node, stormwatch.__version__, self._backend], 1.0)
        spans = new_family("stormwatch_agent_spans_total")
        for outcome, n in sorted(self._tracing.counts().items()):
            spans.add_metric([outcome], float(n))
        yield from (info, spans)


class Agent:
    """One node agent.

    Args:
        config: validated settings.
        fake_nvml: the simulated NVML to use when simulating (tests shape it;
            default: a fresh :class:`FakeNvml` with ``config.sim_gpus`` GPUs).
        clock: Unix time (fault TTLs, snapshot ages).

    Attributes (after :meth:`start`): ``sampler`` (None when every GPU
    collector is off), ``watcher``, ``health`` (:class:`RankHealth`), ``events``
    (:class:`EventLog`), ``faults``, ``collectors``, ``registry``,
    ``gpu_backend``, ``url`` (the read-only listener), ``fault_url`` (the fault
    API's listener; ``""`` when off), ``exposition``, ``tracing`` (:class:`AgentTracing`) and
    ``trace_destination`` (the OTLP URL or the JSON-lines file).
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        fake_nvml: FakeNvml | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._fake = fake_nvml
        self._clock = clock
        self._stack = contextlib.AsyncExitStack()
        self._started = False
        self.sampler: GpuSampler | None = None
        self.gpu_api: NvmlApi | None = None  # the open NVML backend (GPU faults act on it)
        self.gpu_backend = "none"
        self.url = ""
        self.fault_url = ""
        self.trace_destination = ""

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start everything and listen.

        Raises:
            AgentConfigError: bad token file, bad web config (:class:`WebConfigError`),
                unusable metrics directory (or its
                parent missing), state dir held by another agent, or the listen
                address cannot be bound (taken, not local).
            NvmlUnavailable: ``gpu_backend=nvml`` without a driver.
            LedgerError: the fault ledger cannot be opened.
        """
        if self._started:
            raise RuntimeError("agent already started")
        self._started = True
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise

    async def _start(self) -> None:
        cfg = self.config
        stack = self._stack
        token = cfg.read_token()
        web_config = load_web_config(cfg.web_config_file) if cfg.web_config_file else None
        tls = server_ssl_context(web_config) if web_config is not None else None
        _ensure_metrics_dir(cfg.metrics_dir)
        # Before anything in the state dir is opened: one agent per state dir.
        stack.callback(StateDirLock(Path(cfg.resolved_state_dir)).release)

        # Tracing first (closed last, after the shutdown reverts it records), and
        # only now, in the running process (FC-07); its close is bounded (FC-08).
        self.tracing = AgentTracing(
            TracingSettings(
                node=cfg.node,
                trace_file=cfg.resolved_trace_file,
                otlp_endpoint=cfg.otlp_endpoint,
                flush_timeout=cfg.trace_flush_timeout,
            )
        )
        self.trace_destination = self.tracing.destination
        stack.push_async_callback(self._close_tracing)
        tracer = self.tracing.tracer

        ledger = FaultLedger(Path(cfg.resolved_state_dir) / "faults.sqlite3")
        stack.callback(ledger.close)

        self.events = EventLog(cfg.events_file, cfg.node, clock=self._clock)
        exits = open_exit_source() if cfg.enabled("ranks") else None
        if exits is not None:
            stack.callback(exits.close)

        def on_exit(gone: RankExit) -> None:
            self.events.record(
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

        self.watcher = RankWatcher(
            cfg.metrics_dir,
            interval=cfg.rank_scan_interval,
            forget_after=cfg.rank_retention_seconds,
            clock=self._clock,
            tracer=tracer,
            claim_unlabelled=cfg.claim_unlabelled_ranks,
            on_exit=on_exit,
            exits=exits,
        )
        self.watcher.start()
        stack.callback(self.watcher.stop)
        self.health = RankHealth(
            self.watcher,
            cfg.metrics_dir,
            self.events,
            cfg.diagnostics_dir,
            hang=HangSettings(floor_seconds=cfg.hang_floor_seconds, factor=cfg.hang_factor),
            straggler=StragglerSettings(factor=cfg.straggler_factor, samples=cfg.straggler_samples),
            interval=cfg.rank_scan_interval,
            clock=self._clock,
        )
        self.health.start()
        stack.callback(self.health.stop)

        self.faults = FaultManager(
            ledger,
            FaultContext(
                node=cfg.node,
                ranks=self.watcher,
                is_launcher=is_torchrun_agent,
                metrics_dir=Path(cfg.metrics_dir),
                state_dir=Path(cfg.resolved_state_dir),
                gpu=lambda: self.gpu_api,
                simulated_gpus=self._simulated_gpus,
            ),
            clock=self._clock,
            tracer=tracer,
        )
        self.faults.recover()
        stack.push_async_callback(self._revert_on_shutdown)

        collectors: list[Collector] = []
        if any(cfg.enabled(name) for name in _GPU_COLLECTORS):
            backend = stack.enter_context(
                open_backend(cfg.gpu_backend, sim_gpus=cfg.sim_gpus, fake=self._fake)
            )
            self.gpu_backend = backend.name
            self.gpu_api = backend.api
            self.sampler = GpuSampler(
                backend.api,
                SamplerOptions(
                    interval=cfg.sample_interval,
                    nvlink=cfg.enabled("nvlink"),
                    processes=cfg.enabled("gpu_processes"),
                    xid=cfg.enabled("xid"),
                ),
                clock=self._clock,
            )
            self.sampler.start()
            stack.callback(self.sampler.stop)
            sampler = self.sampler
            builders: dict[str, Callable[[], Collector]] = {
                "gpu": lambda: GpuCollector(
                    sampler,
                    hostname=cfg.node,
                    clock=self._clock,
                    events_window_seconds=cfg.clock_events_window_seconds,
                    xid_window_seconds=cfg.xid_window_seconds if cfg.enabled("xid") else None,
                    export_age=False,
                ),
                "nvlink": lambda: NvlinkCollector(sampler, hostname=cfg.node),
                "xid": lambda: XidCollector(
                    sampler,
                    hostname=cfg.node,
                    window_seconds=cfg.xid_window_seconds,
                    clock=self._clock,
                ),
                "gpu_processes": lambda: GpuProcessesCollector(
                    sampler, rank_of_pid=self.watcher.rank_of_pid
                ),
            }
            collectors.extend(builders[name]() for name in _GPU_COLLECTORS if cfg.enabled(name))
        if cfg.enabled("host"):
            collectors.append(HostCollector())
        if cfg.enabled("ranks"):
            collectors.append(
                RanksCollector(
                    self.watcher, clock=self._clock, health=self.health, export_age=False
                )
            )
        if cfg.enabled("trainer"):
            collectors.append(TrainerCollector(cfg.metrics_dir))
        if cfg.enabled("faults"):
            collectors.append(FaultsCollector(ledger))

        self.collectors = CollectorSet(collectors, tracer=tracer)
        info = _InfoCollector(cfg.node, self.gpu_backend, self.tracing)
        info_registry = CollectorRegistry(auto_describe=False)
        info_registry.register(info)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(info)
        self.registry.register(self.collectors)
        collector_set = self.collectors

        def render() -> bytes:
            return generate_latest(info_registry) + collector_set.render()

        self.exposition = ExpositionCache(
            render,
            live=LiveAges(
                self.sampler if cfg.enabled("gpu") else None,
                self.watcher if cfg.enabled("ranks") else None,
                clock=self._clock,
            ),
            sampler=self.sampler,
            period=min(cfg.sample_interval, MAX_EXPOSITION_AGE),
        )
        self.watcher.add_listener(self.exposition.changed)
        deps = ApiDeps(
            node=cfg.node,
            gpu_backend=self.gpu_backend,
            registry=self.registry,
            collectors=self.collectors,
            ranks=self.watcher,
            faults=self.faults,
            token=token,
            max_request_bytes=cfg.max_request_bytes,
            unsupported_metrics=self._unsupported_metrics,
            exposition=self.exposition,
            events=self.events,
            basic_auth=BasicAuth(web_config.basic_auth_users) if web_config else None,
            headers=web_config.http_server_config.headers if web_config else {},
        )
        self.exposition.refresh()
        self.url = await self._listen(build_app(deps), cfg.listen_host, cfg.listen_port, tls)
        if cfg.fault_listen_host is not None:
            self.fault_url = await self._listen(
                build_fault_app(deps),
                cfg.fault_listen_host,
                cfg.fault_listen_port,
                tls,
                what="fault_listen (--fault-api-listen)",
            )
        await self._background(self.exposition.run(), "stormwatch-exposition")
        await self._background(self._expire_loop(), "stormwatch-fault-expiry")
        log.info(
            "agent %s listening on %s%s (GPU backend %s)",
            cfg.node,
            self.url,
            f", fault API on {self.fault_url}" if self.fault_url else ", fault API off",
            self.gpu_backend,
        )

    async def _listen(
        self,
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
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, host, port, ssl_context=tls)
        try:
            await site.start()
        except OSError as exc:
            raise AgentConfigError(
                f"{what}: cannot listen on {host}:{port}: {exc.strerror}"
            ) from exc
        bound, bound_port = runner.addresses[0][:2]
        scheme = "https" if tls is not None else "http"
        return f"{scheme}://{'[' + bound + ']' if ':' in bound else bound}:{bound_port}"

    async def _background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` as a task, cancelled when the agent stops."""
        task = asyncio.create_task(work, name=name)

        async def cancel() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        self._stack.push_async_callback(cancel)

    async def stop(self) -> None:
        """Stop serving and release everything (idempotent)."""
        await self._stack.aclose()

    def _unsupported_metrics(self) -> dict[str, dict[str, str]]:
        """GPU index -> {DCGM metric: why this GPU cannot report it} from the latest sample."""
        snapshot = self.sampler.latest if self.sampler is not None else None
        if snapshot is None:
            return {}
        return {
            str(device.index): dict(sorted(device.unsupported.items()))
            for device in snapshot.devices
            if device.up and device.unsupported
        }

    async def _close_tracing(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.tracing.shutdown)

    async def _expire_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(EXPIRY_PERIOD)
            try:
                if await loop.run_in_executor(None, self.faults.revert_expired):
                    self.exposition.invalidate()
            except Exception:
                log.exception("fault expiry check failed")

    async def _revert_on_shutdown(self) -> None:
        """Leave nothing applied behind when stopping cleanly (FC-13)."""
        loop = asyncio.get_running_loop()
        for record in await loop.run_in_executor(None, self.faults.ledger.active):
            try:
                await loop.run_in_executor(None, self._revert_shutdown, record.id)
            except FaultError as exc:
                log.error(
                    "fault %s not reverted at shutdown (the next start retries): %s", record.id, exc
                )

    def _revert_shutdown(self, fault_id: str) -> None:
        self.faults.revert(fault_id, reason="shutdown")

    def _simulated_gpus(self) -> SimulatedGpus | None:
        """The simulated GPUs the GPU fault kinds act on: the open backend when it is one."""
        return self.gpu_api if isinstance(self.gpu_api, FakeNvml) else None


def _ensure_metrics_dir(path: Path) -> None:
    """Create the metrics dir itself when missing, never its parents (a typo must
    not silently build a tree, e.g. at the filesystem root).

    Raises:
        AgentConfigError: the parent is missing, or the folder cannot be created.
    """
    if path.is_dir():
        return
    if not path.parent.is_dir():
        raise AgentConfigError(
            f"metrics_dir (--metrics-dir): parent folder {path.parent} of {path} does not "
            "exist; create it or fix --metrics-dir"
        )
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise AgentConfigError(
            f"metrics_dir (--metrics-dir): cannot create {path}: {exc.strerror}"
        ) from exc


__all__ = ["EXPIRY_PERIOD", "Agent"]
