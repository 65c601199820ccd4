"""The lab's Slurm cluster: munge, slurmctld and one slurmd per node namespace (issue 15).

::

    from stormwatch.lab.slurm import SlurmCluster, SlurmClusterConfig, SlurmNode
    config = SlurmClusterConfig(
        run_dir=Path("run").resolve(),
        nodes=(SlurmNode(name="node0", netns="sw-node0", address=IPv4Address("10.213.0.10")),),
        controller_address=IPv4Address("10.213.0.1"),
    )
    with SlurmCluster(config) as cluster:
        cluster.commands.nodes()          # {"node0": SlurmNodeInfo(state="IDLE", ...)}

Debian's packages (22.05): ``apt-get install --no-install-recommends slurmctld slurmd
slurm-client munge`` (``make system``). The namespaces are the caller's.

Modules: :mod:`.config` (:class:`SlurmClusterConfig`, :class:`SlurmNode`,
:class:`SlurmPaths`), :mod:`.render` (``slurm.conf``, ``gres.conf``, the nodes' hosts
file), :mod:`.daemons` (munge key, command lines, start, finding and stopping every
process of the cluster), :mod:`.cluster` (:class:`SlurmCluster`), :mod:`.lab_cluster` (the
cluster of a :class:`~stormwatch.lab.config.LabConfig`, what ``lab up`` starts). Commands and state
reads go through the one Slurm command client,
:class:`stormwatch.platforms.slurm.SlurmCommands` (:attr:`SlurmCluster.commands`).

Raises :class:`stormwatch.lab.SlurmError` (a tool missing, munge, a survivor of stop),
:class:`stormwatch.lab.ServiceFailedError` (a daemon did not start or the nodes never
went idle) and :class:`stormwatch.errors.ConfigError` (an invalid config field).
"""

from stormwatch.lab.slurm.cluster import SlurmCluster
from stormwatch.lab.slurm.config import SlurmClusterConfig, SlurmNode, SlurmPaths
from stormwatch.lab.slurm.lab_cluster import cluster_config, lab_cluster
from stormwatch.lab.slurm.render import render_gres_conf, render_hosts, render_slurm_conf

__all__ = [
    "SlurmCluster",
    "SlurmClusterConfig",
    "SlurmNode",
    "SlurmPaths",
    "cluster_config",
    "lab_cluster",
    "render_gres_conf",
    "render_hosts",
    "render_slurm_conf",
]
