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

    def _start_daemons(self) -> None:
        paths, env = self.paths, self.daemon_environment()
        self._pids = {
            "munged": daemons.start_daemon(
                "munged",
                daemons.munged_command(paths),
                pid_file=paths.munged_pid,
                log_file=paths.munged_log,
                env=env,
            ),
            "slurmctld": daemons.start_daemon(
                "slurmctld",
                daemons.slurmctld_command(paths),
                pid_file=paths.slurmctld_pid,
                log_file=paths.slurmctld_log,
                env=env,
            ),
        }
        for node in self.config.nodes:
            self._pids[f"slurmd@{node.name}"] = daemons.start_daemon(
                f"slurmd@{node.name}",
                daemons.slurmd_command(paths, node),
                pid_file=paths.slurmd_pid(node.name),
                log_file=paths.slurmd_log(node.name),
                env=env,
            )

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
        found = [f"process {p.pid}" for p in daemons.cluster_processes(self.config)]
        found += [str(p) for p in daemons.runtime_files(self.config) if p.exists()]
        return found

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


def _idle(node: SlurmNodeInfo | None) -> bool:
    return node is not None and node.state == "IDLE"


__all__ = ["POLL_S", "SlurmCluster"]
