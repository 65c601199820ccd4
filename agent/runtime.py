"""The agent process: wires config, NVML, rank watcher, collectors, ledger and HTTP together.

Everything is created in :meth:`Agent.start`, one subsystem at a time by the builders
of :mod:`.assembly`, each registering its cleanup on one ``AsyncExitStack`` as it is
created, so a failure half-way tears down only what exists, and :meth:`Agent.stop`
undoes it all in reverse order. Signals are the caller's business (the CLI maps
SIGTERM/SIGINT to :meth:`Agent.stop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from stormwatch.agent import assembly
from stormwatch.agent.collectors import RendezvousCollector
from stormwatch.agent.config import AgentConfig, ensure_metrics_dir
from stormwatch.agent.errors import FaultsLeftApplied
from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.fake import FakeNvml
from stormwatch.agent.gpu.sampler import GpuSampler
from stormwatch.agent.server import ApiDeps, build_app, build_fault_app
from stormwatch.agent.statelock import StateDirLock
from stormwatch.agent.watch.events import EventLog
from stormwatch.agent.webconfig import (
    BasicAuth,
    WebConfig,
    load_web_config,
    server_ssl_context,
)

log = logging.getLogger(__name__)

#: Seconds between TTL checks of the fault ledger.
EXPIRY_PERIOD = 0.25


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
        self._probes: list[RendezvousCollector] = []  # their loops start with the listeners

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
            # Each fault left applied is logged; the start's own error is the one to report.
            with contextlib.suppress(FaultsLeftApplied):
                await self._stack.aclose()
            raise

    async def _start(self) -> None:
        cfg, stack, clock = self.config, self._stack, self._clock
        token = cfg.read_token()
        web_config = load_web_config(cfg.web_config_file) if cfg.web_config_file else None
        tls = server_ssl_context(web_config) if web_config is not None else None
        ensure_metrics_dir(cfg.metrics_dir)
        # Before anything in the state dir is opened: one agent per state dir.
        stack.callback(StateDirLock(Path(cfg.resolved_state_dir)).release)

        # Tracing first: closed last, after the shutdown reverts it records.
        self.tracing = assembly.start_tracing(cfg, stack)
        self.trace_destination = self.tracing.destination
        tracer = self.tracing.tracer
        ledger = assembly.open_ledger(cfg, stack)
        self.events = EventLog(cfg.events_file, cfg.node, clock=clock)
        self.watcher = assembly.start_rank_watch(
            cfg, stack, events=self.events, tracer=tracer, clock=clock
        )
        self.health = assembly.start_rank_health(
            cfg, stack, watcher=self.watcher, events=self.events, clock=clock
        )
        gpu = assembly.open_gpu(cfg, stack, fake=self._fake, clock=clock)
        if gpu is not None:
            self.gpu_backend, self.gpu_api = gpu.backend.name, gpu.backend.api
            self.sampler = gpu.sampler
        # After what faults act on (NVML, the watcher): their shutdown revert runs first.
        self.faults = assembly.start_fault_manager(
            cfg,
            stack,
            ledger=ledger,
            watcher=self.watcher,
            gpu=lambda: self.gpu_api,
            tracer=tracer,
            clock=clock,
        )

        collectors = assembly.build_collectors(
            cfg,
            sampler=self.sampler,
            watcher=self.watcher,
            health=self.health,
            ledger=ledger,
            clock=clock,
        )
        self._probes = [c for c in collectors if isinstance(c, RendezvousCollector)]
        exposition = assembly.build_exposition(
            cfg,
            collectors,
            gpu_backend=self.gpu_backend,
            tracing=self.tracing,
            sampler=self.sampler,
            watcher=self.watcher,
            clock=clock,
        )
        self.collectors, self.registry = exposition.collectors, exposition.registry
        self.exposition = exposition.cache
        await self._serve(token, web_config, tls)

    async def _serve(
        self, token: str | None, web_config: WebConfig | None, tls: ssl.SSLContext | None
    ) -> None:
        """Listen (the read-only listener, and the fault API's when configured), then run
        the exposition's refresh and the fault-expiry loop in the background."""
        cfg, stack = self.config, self._stack
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
        self.url = await assembly.listen(
            stack, build_app(deps), cfg.listen_host, cfg.listen_port, tls
        )
        if cfg.fault_listen_host is not None:
            self.fault_url = await assembly.listen(
                stack,
                build_fault_app(deps),
                cfg.fault_listen_host,
                cfg.fault_listen_port,
                tls,
                what="fault_listen (--fault-api-listen)",
            )
        await assembly.run_in_background(stack, self.exposition.run(), "stormwatch-exposition")
        await assembly.run_in_background(stack, self._expire_loop(), "stormwatch-fault-expiry")
        for probes in self._probes:
            await assembly.run_in_background(stack, probes.run(), "stormwatch-rendezvous-probe")
        log.info(
            "agent %s listening on %s%s (GPU backend %s)",
            cfg.node,
            self.url,
            f", fault API on {self.fault_url}" if self.fault_url else ", fault API off",
            self.gpu_backend,
        )

    async def stop(self) -> None:
        """Stop serving, revert every applied fault and release everything (idempotent).

        Raises:
            FaultsLeftApplied: a fault could not be reverted (everything else is released).
        """
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

    async def _expire_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(EXPIRY_PERIOD)
            if not self.faults.expiry_due():
                continue
            try:
                if await loop.run_in_executor(None, self.faults.revert_expired):
                    self.exposition.invalidate()
            except Exception:
                log.exception("fault expiry check failed")


__all__ = ["EXPIRY_PERIOD", "Agent"]
