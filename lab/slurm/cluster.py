"""One Slurm cluster of the lab: munged and slurmctld in the root namespace, one slurmd per
node namespace, everything under ``<run_dir>/slurm`` (:class:`SlurmCluster`).

::

    cluster = SlurmCluster(SlurmClusterConfig(run_dir=..., nodes=..., controller_address=...))
    with cluster:                       # start(): config, munge, daemons, nodes idle
        job = cluster.commands.submit(["-N2", "--wrap", "srun hostname"])
        cluster.commands.job(job).state
    # stop(): no daemon, step, job process, pid file, spool or mount left

The namespaces themselves (and their addresses) belong to the caller, the lab.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import psutil

from stormwatch.lab.errors import ServiceFailedError
from stormwatch.lab.services.procs import LAB_MARKER_ENV, log_tail
from stormwatch.lab.slurm import daemons
from stormwatch.lab.slurm.config import SlurmClusterConfig
from stormwatch.lab.slurm.render import render_gres_conf, render_hosts, render_slurm_conf
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.slurm import SlurmCommands, SlurmNodeInfo

log = logging.getLogger(__name__)

#: Seconds between two readings of the nodes' state while waiting for them.
POLL_S = 0.05


class SlurmCluster:
    """Start, wait for and stop one lab Slurm cluster.

    Every process it starts, and every command of :attr:`commands`, gets
    ``SLURM_CONF=<run_dir>/slurm/slurm.conf`` and the lab's process marker
    (``STORMWATCH_LAB_RUN_DIR=<run_dir>``) in its environment, so a job submitted through
    :attr:`commands` carries them too.

    Args:
        config: the cluster's shape, names and ports.
        env: extra environment of the daemons and commands (over this process's).
    """

    def __init__(self, config: SlurmClusterConfig, *, env: Mapping[str, str] | None = None):
        self.config = config
        self.paths = config.paths
        self._env = {
            **(env or {}),
            "SLURM_CONF": str(self.paths.slurm_conf),
            LAB_MARKER_ENV: str(config.run_dir),
        }
        #: The Slurm command client pointed at this cluster.
        self.commands = SlurmCommands(conf=self.paths.slurm_conf, env=self._env)
        self._pids: dict[str, int] = {}

    def daemon_environment(self) -> dict[str, str]:
        """The environment every daemon starts with."""
        return {**os.environ, **self._env}

    def write_config(self) -> None:
        """Write ``slurm.conf``, ``gres.conf``, each node's hosts file, stand-in GPU devices
        and the folders the daemons write to (run again on every start)."""
        paths = self.paths
        for folder in (paths.root, paths.logs_dir, paths.state_dir, paths.nodes_dir):
            folder.mkdir(parents=True, exist_ok=True)
        paths.slurm_conf.write_text(render_slurm_conf(self.config))
        paths.gres_conf.write_text(render_gres_conf(self.config))
        hosts = render_hosts(self.config)
        for node in self.config.nodes:
            paths.node_dir(node.name).mkdir(parents=True, exist_ok=True)
            paths.node_spool(node.name).mkdir(parents=True, exist_ok=True)
            paths.node_hosts(node.name).write_text(hosts)
            # No nameserver: a name the hosts file lacks fails at once (no resolver timeout).
            paths.node_resolv(node.name).write_text("options timeout:1 attempts:1\n")
            devices = paths.node_devices(node.name)
            devices.mkdir(parents=True, exist_ok=True)
            for index in range(node.gpus):
                (devices / f"gpu{index}").touch()

    def start(self) -> float:
        """Start the cluster and wait until every node is idle; on any failure, stop it.

        Whatever a crashed earlier cluster of the same run directory left is stopped and
        removed first.

        Returns:
            Seconds from the first daemon's start to every node idle.

        Raises:
            SlurmError: a program or the ``munge`` user is missing, or munged cannot
                reach its folder (nothing is started then).
            ServiceFailedError: a daemon did not start, or the nodes were not idle within
                ``ready_timeout_s`` (the daemon and its log named).
        """
        daemons.require_tools()
        self.stop()
        try:
            self.write_config()
            daemons.prepare_munge(self.paths)
            started = time.monotonic()
            self._start_daemons()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        ready_after = time.monotonic() - started
        log.info(
            "Slurm cluster in %s: %d nodes idle after %.2f s",
            self.paths.root,
            len(self.config.nodes),
            ready_after,
        )
        return ready_after

    def _daemons(self) -> dict[str, tuple[list[str], Path]]:
        """Every daemon in start order: service -> (command, pid file)."""
        paths = self.paths
        found = {
            "munged": (daemons.munged_command(paths), paths.munged_pid),
            "slurmctld": (daemons.slurmctld_command(paths), paths.slurmctld_pid),
        }
        for node in self.config.nodes:
            found[f"slurmd@{node.name}"] = (
                daemons.slurmd_command(paths, node),
                paths.slurmd_pid(node.name),
            )
        return found

    def _start(self, services: list[str]) -> None:
        env = self.daemon_environment()
        for service, (argv, pid_file) in self._daemons().items():
            if service in services:
                self._pids[service] = daemons.start_daemon(
                    service, argv, pid_file=pid_file, log_file=self._log_of(service), env=env
                )

    def _start_daemons(self) -> None:
        self._pids = {}
        self._start(list(self._daemons()))

    def dead_daemons(self) -> list[str]:
        """The daemons of a started cluster whose pid file names no live process
        (``munged``, ``slurmctld``, ``slurmd@<node>``), in start order."""
        return [
            service
            for service, (_, pid_file) in self._daemons().items()
            if (pid := daemons.read_pid(pid_file)) is None or not psutil.pid_exists(pid)
        ]

    def restart_dead(self, timeout: float | None = None) -> list[str]:
        """Start again each daemon that died, in start order, and wait until slurmctld
        answers and every restarted slurmd's node responds again (what systemd's
        ``Restart=`` does on a real cluster). Running jobs survive: slurmctld recovers
        them from its ``StateSaveLocation`` (it is not started with ``-c``), and a slurmd
        finds its steps' slurmstepd again.

        Args:
            timeout: seconds to wait for the nodes (default: ``ready_timeout_s``).

        Returns:
            The daemons restarted; empty when every daemon ran.

        Raises:
            ServiceFailedError: a daemon did not start, or a node did not respond in time.
        """
        dead = self.dead_daemons()
        if not dead:
            return []
        if "munged" in dead and not self.paths.munge_key.is_file():
            daemons.prepare_munge(
                self.paths
            )  # the key is kept when it exists: credentials stay valid
        self._start(dead)
        # A restarted slurmctld knows its nodes again once each slurmd answers its ping
        # (UNKNOWN until then); a restarted slurmd, once it registers.
        everyone = "slurmctld" in dead or "munged" in dead
        nodes = [n.name for n in self.config.nodes if everyone or f"slurmd@{n.name}" in dead]
        limit = self.config.ready_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            try:
                found = self.commands.nodes()
            except BackendError:  # slurmctld not answering yet: read again
                found = {}
            late = [n for n in nodes if not _responding(found.get(n))]
            if found and not late:
                return dead
            if time.monotonic() >= deadline:
                service = f"slurmd@{late[0]}" if late else "slurmctld"
                log_file = self._log_of(service)
                raise ServiceFailedError(
                    f"{service} restarted but not responding after {limit:g} s; "
                    f"{log_file}:\n{log_tail(log_file)}",
                    service=service,
                    log_file=log_file,
                )
            time.sleep(POLL_S)

    def wait_ready(self, timeout: float | None = None) -> dict[str, SlurmNodeInfo]:
        """Wait until every node reports ``IDLE`` (no flag) to ``scontrol show node``.

        Args:
            timeout: seconds (default: the config's ``ready_timeout_s``).

        Returns:
            The nodes as last read, by name.

        Raises:
            ServiceFailedError: a daemon this cluster started exited, or a node was not
                idle in time (names the first such node's slurmd and its state).
        """
        limit = self.config.ready_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        nodes: dict[str, SlurmNodeInfo] = {}
        while True:
            self._check_daemons()
            try:
                nodes = self.commands.nodes()
            except BackendError:  # slurmctld not answering yet: read again
                nodes = {}
            waiting = [n.name for n in self.config.nodes if not _idle(nodes.get(n.name))]
            if not waiting:
                return nodes
            if time.monotonic() >= deadline:
                first = waiting[0]
                state = nodes[first].state if first in nodes else "not known to slurmctld"
                log_file = self.paths.slurmd_log(first)
                raise ServiceFailedError(
                    f"slurmd@{first} not idle after {limit:g} s (state {state}); "
                    f"{log_file}:\n{log_tail(log_file)}",
                    service=f"slurmd@{first}",
                    log_file=log_file,
                )
            time.sleep(POLL_S)

    def _check_daemons(self) -> None:
        for service, pid in self._pids.items():
            if not psutil.pid_exists(pid):
                log_file = self._log_of(service)
                raise ServiceFailedError(
                    f"{service} (pid {pid}) exited; {log_file}:\n{log_tail(log_file)}",
                    service=service,
                    log_file=log_file,
                )

    def _log_of(self, service: str) -> Path:
        if service == "munged":
            return self.paths.munged_log
        if service == "slurmctld":
            return self.paths.slurmctld_log
        return self.paths.slurmd_log(service.removeprefix("slurmd@"))

    def stop(self) -> None:
        """Stop every process of the cluster and delete its runtime files (pid files,
        spools, controller state, munge key and socket); configs and logs stay.

        Idempotent, and needs no pid file: processes are found by environment and mount
        namespace (:func:`~stormwatch.lab.slurm.daemons.cluster_processes`), so it also
        cleans up after a crash, whatever pids the pid files name.

        Raises:
            SlurmError: a process survived (the files are left in place then).
        """
        daemons.stop_processes(self.config)
        daemons.remove_runtime_files(self.config)
        self._pids = {}

    def leftovers(self) -> list[str]:
        """What of the cluster still exists (processes, runtime files); [] after :meth:`stop`."""
        processes, files = self.remains()
        return [f"process {p.pid}" for p in processes] + [str(p) for p in files]

    def remains(self) -> tuple[list[psutil.Process], list[Path]]:
        """The cluster's live processes and its runtime files and folders that exist
        (:meth:`leftovers`, apart); both empty after :meth:`stop`."""
        processes = daemons.cluster_processes(self.config)
        return processes, [p for p in daemons.runtime_files(self.config) if p.exists()]

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _responding(node: SlurmNodeInfo | None) -> bool:
    """slurmctld hears the node's slurmd (not NOT_RESPONDING, DOWN or UNKNOWN)."""
    return (
        node is not None
        and "NOT_RESPONDING" not in node.flags
        and node.base_state not in ("DOWN", "UNKNOWN")
    )


def _idle(node: SlurmNodeInfo | None) -> bool:
    return node is not None and node.state == "IDLE"


__all__ = ["POLL_S", "SlurmCluster"]
