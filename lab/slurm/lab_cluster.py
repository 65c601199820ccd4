"""The lab's own Slurm cluster, derived from its :class:`~stormwatch.lab.config.LabConfig`.

One Slurm node per lab node, with the same name (``node0`` ...), in the node's namespace
at its address; ``slurmctld`` on the bridge address at ``LabConfig.slurmctld_port``; one
partition ``lab`` holding every node; ``Gres=gpu:<nproc_per_node>`` stand-in GPUs, so the
recipe's ``--gpus-per-node`` header runs. Everything is derived from the configuration
alone, so ``lab down`` finds the cluster again after a crash without ``lab.json``.

munged's folder and the slurmd spools live under :func:`runtime_dir` (``/run/stormwatch/
slurm-<prefix>``): the ``munge`` user must be able to enter it, and a spool's step sockets
must fit the 108-byte Unix socket path limit, neither of which a run directory guarantees.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from stormwatch.lab.config import LabConfig
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.slurm.cluster import SlurmCluster
from stormwatch.lab.slurm.config import SlurmClusterConfig, SlurmNode

#: Parent of every lab cluster's runtime folder (``/run``: tmpfs, root-owned, 0755).
RUNTIME_ROOT = Path("/run/stormwatch")


def runtime_dir(config: LabConfig) -> Path:
    """munged's folder and the spools of the lab with ``config``'s prefix (one lab owns a
    prefix at a time, :mod:`stormwatch.lab.registry`)."""
    return RUNTIME_ROOT / f"slurm-{config.prefix}"


def cluster_config(run_dir: Path, config: LabConfig) -> SlurmClusterConfig:
    """The Slurm cluster of the lab with ``config`` in ``run_dir``."""
    nodes = tuple(
        SlurmNode(
            name=config.node_name(i),
            netns=config.netns(i),
            address=config.node_address(i),
            gpus=config.nproc_per_node,
        )
        for i in range(config.nodes)
    )
    return SlurmClusterConfig(
        run_dir=RunPaths.of(run_dir).run_dir,
        nodes=nodes,
        controller_address=config.bridge_interface.ip,
        slurmctld_port=config.slurmctld_port,
        kill_wait_s=config.grace_period_s,
        runtime_dir=runtime_dir(config),
    )


def lab_cluster(
    run_dir: Path, config: LabConfig, env: Mapping[str, str] | None = None
) -> SlurmCluster:
    """The :class:`SlurmCluster` of the lab (nothing is started)."""
    return SlurmCluster(cluster_config(run_dir, config), env=env)


__all__ = ["RUNTIME_ROOT", "cluster_config", "lab_cluster", "runtime_dir"]
