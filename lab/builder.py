"""Creating a lab's network and services, in order, each recorded before it exists.

:class:`LabBuilder` is :class:`~stormwatch.lab.lab.Lab`'s collaborator for the work
of ``lab up``: fresh service files and tokens, the bridge, one namespace and veth
pair per node, the Slurm cluster (munged, slurmctld, one slurmd per node namespace:
:mod:`stormwatch.lab.slurm`), then every service (agents in their namespaces, Prometheus,
Alertmanager, the responder), waiting until each is healthy and Prometheus scrapes
every agent. Each kernel object and process is written to ``lab.json`` *before*
(or as) it is created and its removal registered on the caller's
:class:`contextlib.ExitStack` right after, so a failed ``up`` unwinds exactly what
it did (:meth:`LabBuilder.unwind`). It also restarts dead services of a lab that
is up (:meth:`LabBuilder.restart`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import shutil
import time
from pathlib import Path

from stormwatch.lab import teardown
from stormwatch.lab.config import NODE_INTERFACE, LabConfig
from stormwatch.lab.errors import LabError, ServiceFailedError
from stormwatch.lab.netns import NetworkLayer
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.progress import Progress, ProgressEvent
from stormwatch.lab.services import definitions as services
from stormwatch.lab.services import health, procs
from stormwatch.lab.slurm.lab_cluster import lab_cluster
from stormwatch.lab.state import LabState, NetResource, ProcessRecord, SlurmState, StateStore

log = logging.getLogger(__name__)


def write_secret(path: Path) -> None:
    """A fresh bearer token (32 random bytes, URL-safe) in ``path``, mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(secrets.token_urlsafe(32) + "\n")


def never_raises(report: Progress) -> Progress:
    """``report``, but a failure to report (e.g. a closed pipe) is logged, not raised."""

    def safe(event: ProgressEvent) -> None:
        try:
            report(event)
        except BaseException as exc:
            log.warning("could not report %s: %r", event.message, exc)

    return safe


def describe_failure(exc: BaseException) -> str:
    """A meaningful one-line reason for ``lab.json``'s ``error`` (never a bare errno)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C or SIGTERM)"
    if isinstance(exc, SystemExit) and isinstance(exc.__context__, BrokenPipeError):
        exc = exc.__context__
    if isinstance(exc, BrokenPipeError):
        return "lab up's output pipe was closed (its reader exited), so it stopped"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}" + (
            f" ({exc.filename})" if exc.filename else ""
        )
    if isinstance(exc, SystemExit):
        return f"lab up exited with status {exc.code} while starting"
    text = str(exc)
    if not text or text.isdigit():
        return f"{type(exc).__name__}({text})" if text else type(exc).__name__
    return text


class LabBuilder:
    """Creates (and restarts) the parts of one lab, saving its state as it goes.

    Args:
        paths: the run directory's paths.
        store: where the state is saved after every change.
        network: the network layer that creates bridges, namespaces and links.
        env: the environment every service process starts with (carries the lab marker).
    """

    def __init__(
        self, paths: RunPaths, store: StateStore, network: NetworkLayer, env: dict[str, str]
    ) -> None:
        self._paths = paths
        self._store = store
        self._network = network
        self._env = env

    def create(self, state: LabState, undo: contextlib.ExitStack, report: Progress) -> None:
        """Files, network, then services of ``state`` (see the module docstring).

        Raises:
            ServiceFailedError: a service exited or did not become healthy in time.
            LabError, OSError: a part could not be created (the caller unwinds ``undo``).
        """
        self._prepare_files(state)
        rules = services.rules_dir()
        inventory = services.write_inventory(state, self._paths)
        services.write_prometheus_config(state, self._paths, rules, inventory)
        services.check_prometheus_config(self._paths.prometheus_config)
        services.write_alertmanager_config(state, self._paths)
        services.write_grafana_files(state, self._paths)
        self._create_network(state, undo, report)
        self._start_slurm(state, undo, report)
        launched: list[ProcessRecord] = []
        undo.callback(teardown.stop_processes, launched, never_raises(report))
        checks = []
        for spec in services.service_specs(state, self._paths):
            report(ProgressEvent("start", spec.name, f"starting {spec.name}"))
            record = self._launch(state, spec)
            launched.append(record)
            checks.append(health.HealthCheck(record, spec.health_url))
        self._wait(state, checks, report)
        report(ProgressEvent("ready", "prometheus", "Prometheus scrapes every agent"))

    def restart(self, state: LabState, dead: set[str], report: Progress) -> None:
        """Start the services named in ``dead`` again and wait until they are healthy and scraped.

        Raises:
            ServiceFailedError: a restarted service did not become healthy in time, or
                its earlier processes were not gone after SIGKILL (not started again).
        """
        checks = []
        for spec in services.service_specs(state, self._paths):
            if spec.name not in dead:
                continue
            earlier = state.processes.get(spec.name)
            left = [] if earlier is None else procs.terminate(procs.tree(earlier))
            if left and earlier is not None:  # never two of a service (its port, its lock)
                raise ServiceFailedError(
                    f"{spec.name}: {', '.join(left)} of the earlier one still running after "
                    "SIGKILL; not started again",
                    service=spec.name,
                    log_file=earlier.log_file,
                )
            report(ProgressEvent("start", spec.name, f"restarting {spec.name}"))
            checks.append(health.HealthCheck(self._launch(state, spec), spec.health_url))
        self._wait(state, checks, report)
        state.error = None
        self._store.save(state)

    def unwind(self, undo: contextlib.ExitStack, config: LabConfig, report: Progress) -> None:
        """Run the registered removals (newest first), then sweep what they could miss."""
        try:
            undo.close()
        except Exception:
            log.exception("undoing a failed lab up failed; sweeping")
        try:
            teardown.teardown(self._store, self._network, config, report)
        except LabError:
            log.exception("sweeping after a failed lab up left things behind")

    def _create_network(
        self, state: LabState, undo: contextlib.ExitStack, report: Progress
    ) -> None:
        """The bridge, then per node its namespace and veth pair (each recorded first)."""
        config = state.config
        undo_report = never_raises(report)
        self._remember(state, NetResource(kind="bridge", name=state.bridge), undo, undo_report)
        self._network.add_bridge(state.bridge, state.bridge_address)
        report(
            ProgressEvent("create", state.bridge, f"bridge {state.bridge} {state.bridge_address}")
        )
        hosts = {str(state.bridge_address.ip): f"{config.prefix}-host"}
        hosts.update({str(n.address): n.netns for n in state.nodes})
        for node in state.nodes:
            self._remember(state, NetResource(kind="netns", name=node.netns), undo, undo_report)
            self._network.add_namespace(node.netns, hosts)
            self._remember(state, NetResource(kind="veth", name=node.veth), undo, undo_report)
            self._network.add_node_link(
                netns=node.netns,
                veth=node.veth,
                interface=NODE_INTERFACE,
                bridge=state.bridge,
                address=ipaddress.IPv4Interface(f"{node.address}/{config.subnet.prefixlen}"),
                gateway=state.bridge_address.ip,
            )
            report(ProgressEvent("create", node.netns, f"namespace {node.netns} {node.address}"))

    def _start_slurm(self, state: LabState, undo: contextlib.ExitStack, report: Progress) -> None:
        """munged, slurmctld and one slurmd per node namespace, until every node is idle
        (recorded in ``lab.json`` first; its stop registered on ``undo``).

        Raises:
            SlurmError, ServiceFailedError: see :meth:`SlurmCluster.start` (it stopped
                what it had started).
        """
        config = state.config
        if not config.slurm:
            return
        cluster = lab_cluster(self._paths.run_dir, config, env=self._env)
        state.slurm = SlurmState(
            conf=cluster.paths.slurm_conf,
            controller_address=cluster.config.controller_address,
            controller_port=cluster.config.slurmctld_port,
            partition=cluster.config.partition,
            nodes=[n.name for n in cluster.config.nodes],
        )
        self._store.save(state)
        undo.callback(cluster.stop)
        report(ProgressEvent("start", "slurm", "starting munged, slurmctld and a slurmd per node"))
        state.slurm.ready_after_s = round(cluster.start(), 3)
        self._store.save(state)
        report(
            ProgressEvent(
                "ready",
                "slurm",
                f"Slurm nodes idle after {state.slurm.ready_after_s:.2f} s ({state.slurm.describe()})",
            )
        )

    def _remember(
        self,
        state: LabState,
        resource: NetResource,
        undo: contextlib.ExitStack,
        report: Progress,
    ) -> None:
        """Record ``resource`` in ``lab.json`` and register its removal, before it is made."""
        state.resources.append(resource)
        self._store.save(state)
        undo.callback(teardown.remove_resource, self._network, resource, report)

    def _launch(self, state: LabState, spec: services.ServiceSpec) -> ProcessRecord:
        """Start one service behind its supervisor and record it in ``lab.json``."""
        record = procs.launch(
            spec.name,
            spec.cmd,
            log_file=self._paths.service_log(spec.name),
            status_file=self._paths.service_status(spec.name),
            env=self._env,
            netns=spec.netns,
            cwd=self._paths.run_dir,
        )
        state.processes[spec.name] = record
        self._store.save(state)
        return record

    def _wait(self, state: LabState, checks: list[health.HealthCheck], report: Progress) -> None:
        """Until every check is healthy and Prometheus scrapes every agent (one deadline)."""
        timeout = state.config.startup_timeout
        deadline = time.monotonic() + timeout

        def ready(name: str) -> None:
            report(ProgressEvent("ready", name, f"{name} is healthy"))

        health.wait_healthy(checks, timeout=timeout, on_ready=ready)
        health.wait_scraped(state, deadline)

    def _prepare_files(self, state: LabState) -> None:
        """Fresh service data (no alerts, notifications or series from an earlier lab); a
        runbook policy of the run's own (``<run>/responder/policy.yml``) is kept."""
        paths = self._paths
        for folder in (paths.prometheus_data, paths.alertmanager_data):
            shutil.rmtree(folder, ignore_errors=True)
        own_policy = paths.responder_dir / "policy.yml"  # the run's own runbook policy stays
        if paths.responder_dir.is_dir():
            for entry in paths.responder_dir.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                elif entry != own_policy:
                    entry.unlink()
        for node in state.nodes:
            shutil.rmtree(paths.node_dir(node.name), ignore_errors=True)
            node.metrics_dir.mkdir(parents=True, exist_ok=True)
        for folder in (paths.logs_dir, paths.prometheus_data, paths.alertmanager_data):
            folder.mkdir(parents=True, exist_ok=True)
        paths.responder_dir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def write_secrets(state: LabState, *, fresh: bool = False) -> None:
        """The agents' and the responder's tokens: new ones with ``fresh`` (each ``lab up``
        that creates a lab), else only when one is missing. ``lab up`` writes them before
        the lab's target file, which names them (:mod:`stormwatch.lab.target_file`)."""
        if fresh or not (state.agent_token_file.is_file() and state.responder_token_file.is_file()):
            write_secret(state.agent_token_file)
            write_secret(state.responder_token_file)


__all__ = ["LabBuilder", "describe_failure", "never_raises", "write_secret"]
