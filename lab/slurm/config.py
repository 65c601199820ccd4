"""Settings of the lab's Slurm cluster (:class:`SlurmClusterConfig`) and where its files live
(:class:`SlurmPaths`).

Both are frozen; the configuration validates on construction and raises
:class:`stormwatch.errors.ConfigError` naming the field and what is allowed.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.errors import ConfigError
from stormwatch.lab.paths import RunPaths
from stormwatch.platforms.stopping import MAX_GRACE_PERIOD_S

#: A Slurm node name that is also a valid hostname (it becomes the namespace's hostname).
_HOSTNAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
#: Slurm's own default ports (slurm.conf(5): SlurmctldPort 6817, SlurmdPort 6818).
DEFAULT_SLURMCTLD_PORT = 6817
DEFAULT_SLURMD_PORT = 6818


def _short_hostname() -> str:
    return socket.gethostname().split(".", 1)[0]


@dataclass(frozen=True, kw_only=True)
class SlurmNode:
    """One compute node: a network namespace running one ``slurmd``.

    Attributes:
        name: the Slurm ``NodeName``, also the hostname inside the namespace (``node0``).
        netns: the network namespace (``/run/netns/<netns>``, made by ``ip netns add``).
        address: the node's address inside the namespace (Slurm's ``NodeAddr``).
        cpus: CPUs Slurm may allocate on it (``CPUs=``; select/cons_tres ``CR_CPU``).
        gpus: GPUs it offers (``Gres=gpu:<gpus>``, backed by stand-in device files).
    """

    name: str
    netns: str
    address: ipaddress.IPv4Address
    cpus: int = 2
    gpus: int = 0

    def __post_init__(self) -> None:
        if not _HOSTNAME.fullmatch(self.name):
            raise ConfigError(
                f"SlurmNode.name: {self.name!r} is not a lowercase hostname "
                "(a-z, 0-9, '-', starting with a letter)"
            )
        if not self.netns or "/" in self.netns:
            raise ConfigError(f"SlurmNode.netns: {self.netns!r} is not a namespace name")
        if self.cpus < 1:
            raise ConfigError(f"SlurmNode.cpus: must be >= 1 (got {self.cpus})")
        if self.gpus < 0:
            raise ConfigError(f"SlurmNode.gpus: must be >= 0 (got {self.gpus})")


@dataclass(frozen=True, kw_only=True)
class SlurmClusterConfig:
    """Shape, names and ports of one lab Slurm cluster.

    ``slurmctld`` and ``munged`` run in the root namespace; ``slurmctld`` listens on
    ``slurmctld_port`` of every address and the nodes reach it at ``controller_address``
    (the lab bridge's address). Each ``slurmd`` listens on ``slurmd_port`` inside its own
    namespace, so one port serves every node.

    Attributes:
        run_dir: the lab's run directory; the cluster lives in ``<run_dir>/slurm``.
        nodes: the compute nodes, in order (at least one; names, namespaces and
            addresses distinct).
        controller_address: where the nodes reach ``slurmctld`` (the bridge address).
        controller_host: ``SlurmctldHost`` name; slurmctld only starts on a host of this
            name (default: this machine's short hostname).
        cluster_name: ``ClusterName``.
        partition: name of the one partition (all nodes; the default partition).
        slurmctld_port: ``SlurmctldPort`` (Slurm's default 6817; a second cluster on the
            machine needs another).
        slurmd_port: ``SlurmdPort`` inside each namespace (Slurm's default 6818).
        cred_expire_s: munge credential lifetime (``AuthInfo=cred_expire``); a requeued
            job waits ``cred_expire_s + 1`` s before it may start again. 10 s is the issue's
            measured working value (Slurm's default is 120 s).
        kill_wait_s: ``KillWait``: seconds from SIGTERM to SIGKILL of a cancelled or
            requeued job's processes (the lab's ``grace_period_s``, 5 s by default).
        ready_timeout_s: seconds :meth:`SlurmCluster.start` waits for every node idle
            (cold start measured well under 1 s on the lab machine).
        runtime_dir: where munged's folder and the slurmd spools live instead of under
            ``<run_dir>/slurm`` (None: there). The lab uses a short folder under ``/run``:
            the ``munge`` user must be able to enter it (a pytest or ``mktemp -d`` run
            directory is 0700) and the step sockets in a spool must fit Unix sockets'
            108-byte path limit. Removed whole by :meth:`SlurmCluster.stop`.
    """

    run_dir: Path
    nodes: tuple[SlurmNode, ...]
    controller_address: ipaddress.IPv4Address
    controller_host: str = field(default_factory=_short_hostname)
    cluster_name: str = "stormwatch"
    partition: str = "lab"
    slurmctld_port: int = DEFAULT_SLURMCTLD_PORT
    slurmd_port: int = DEFAULT_SLURMD_PORT
    cred_expire_s: int = 10
    kill_wait_s: int = 5
    ready_timeout_s: float = 30.0
    runtime_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.run_dir.is_absolute():
            raise ConfigError(f"SlurmClusterConfig.run_dir: must be absolute (got {self.run_dir})")
        if self.runtime_dir is not None and not self.runtime_dir.is_absolute():
            raise ConfigError(
                f"SlurmClusterConfig.runtime_dir: must be absolute (got {self.runtime_dir})"
            )
        if not self.nodes:
            raise ConfigError("SlurmClusterConfig.nodes: at least one node is needed")
        for what in ("name", "netns", "address"):
            values = [getattr(node, what) for node in self.nodes]
            if len(set(values)) != len(values):
                raise ConfigError(
                    f"SlurmClusterConfig.nodes: every node needs its own {what} (got {values})"
                )
        for what in ("cluster_name", "partition"):
            if not _HOSTNAME.fullmatch(getattr(self, what)):
                raise ConfigError(
                    f"SlurmClusterConfig.{what}: lowercase letters, digits and '-' only "
                    f"(got {getattr(self, what)!r})"
                )
        for what in ("slurmctld_port", "slurmd_port"):
            port = getattr(self, what)
            if not 1 <= port <= 65535:
                raise ConfigError(f"SlurmClusterConfig.{what}: must be 1-65535 (got {port})")
        if not 0 <= self.kill_wait_s <= MAX_GRACE_PERIOD_S:
            raise ConfigError(
                f"SlurmClusterConfig.kill_wait_s: must be 0..{MAX_GRACE_PERIOD_S} "
                f"(got {self.kill_wait_s})"
            )
        if self.cred_expire_s < 1 or self.ready_timeout_s <= 0:
            raise ConfigError(
                "SlurmClusterConfig.cred_expire_s / ready_timeout_s: must be positive "
                f"(got {self.cred_expire_s}, {self.ready_timeout_s})"
            )

    @property
    def paths(self) -> SlurmPaths:
        """Where the cluster's files live."""
        return SlurmPaths(RunPaths.of(self.run_dir).slurm_dir, self.runtime_dir)

    def node(self, name: str) -> SlurmNode:
        """The node called ``name``.

        Raises:
            ConfigError: no node has that name.
        """
        for node in self.nodes:
            if node.name == name:
                return node
        raise ConfigError(f"no Slurm node {name!r}; nodes: {[n.name for n in self.nodes]}")


@dataclass(frozen=True)
class SlurmPaths:
    """Files of one cluster under ``<run_dir>/slurm`` (absolute; nothing is created here).

    ``slurm.conf`` names per-node files with Slurm's ``%n`` (the node name), so the
    per-node paths here are what Slurm expands those to.
    """

    root: Path
    #: munged's folder and the spools, when not under :attr:`root`
    #: (:attr:`SlurmClusterConfig.runtime_dir`).
    runtime: Path | None = None

    @property
    def slurm_conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        """``gres.conf``: slurmd reads it from the folder of ``slurm.conf``."""
        return self.root / "gres.conf"

    @property
    def munge_dir(self) -> Path:
        """munged's folder: owned by ``munge``, mode 0755 (clients reach the socket)."""
        return (self.runtime or self.root) / "munge"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munged_pid(self) -> Path:
        return self.munge_dir / "munged.pid"

    @property
    def munged_log(self) -> Path:
        """In :attr:`munge_dir`: munged runs as ``munge`` and writes nowhere else."""
        return self.munge_dir / "munged.log"

    @property
    def logs_dir(self) -> Path:
        """slurmctld's and every slurmd's log (kept by the stop, for the post-mortem)."""
        return self.root / "logs"

    @property
    def munged_seed(self) -> Path:
        return self.munge_dir / "munged.seed"

    @property
    def controller_dir(self) -> Path:
        return self.root / "ctl"

    @property
    def state_dir(self) -> Path:
        """``StateSaveLocation``: slurmctld's job and node state."""
        return self.controller_dir / "state"

    @property
    def slurmctld_pid(self) -> Path:
        return self.controller_dir / "slurmctld.pid"

    @property
    def slurmctld_log(self) -> Path:
        return self.logs_dir / "slurmctld.log"

    @property
    def nodes_dir(self) -> Path:
        return self.root / "nodes"

    def node_dir(self, node: str) -> Path:
        return self.nodes_dir / node

    def node_spool(self, node: str) -> Path:
        """``SlurmdSpoolDir`` of ``node`` (batch scripts, step sockets)."""
        if self.runtime is not None:
            return self.runtime / "spool" / node
        return self.node_dir(node) / "spool"

    def slurmd_pid(self, node: str) -> Path:
        return self.node_dir(node) / "slurmd.pid"

    def slurmd_log(self, node: str) -> Path:
        return self.logs_dir / f"slurmd-{node}.log"

    def node_hosts(self, node: str) -> Path:
        """The node's ``/etc/hosts``, bind-mounted over ``/etc/hosts`` inside its namespace."""
        return self.node_dir(node) / "hosts"

    def node_resolv(self, node: str) -> Path:
        """The node's ``/etc/resolv.conf`` (no nameserver), ``resolv`` beside :meth:`node_hosts`."""
        return self.node_dir(node) / "resolv"

    def node_devices(self, node: str) -> Path:
        """Stand-in GPU device files of ``node`` (``gpu0`` ...), listed in ``gres.conf``."""
        return self.node_dir(node) / "dev"


__all__ = [
    "DEFAULT_SLURMCTLD_PORT",
    "DEFAULT_SLURMD_PORT",
    "SlurmClusterConfig",
    "SlurmNode",
    "SlurmPaths",
]
