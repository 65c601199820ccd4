"""The agent's collectors: one module each, each with an on/off switch (``--disable-collector``).

=================  ===============================================================
``gpu``            DCGM-compatible device metrics, ``stormwatch_gpu_up`` (FC-02)
``nvlink``         per-link state / support / throughput (FC-04, FC-05)
``xid``            XID counters (FC-03)
``gpu_processes``  GPU memory per rank, with FC-06 checks
``host``           CPU and memory of the node
``network``        the node's kernel network counters (node_exporter's netstat, netdev)
``qdisc``          the node's root queueing disciplines (node_exporter's qdisc)
``ranks``          rank watcher: up, exits, progress; hangs, lag, stragglers
``trainer``        the ranks' multiprocess files (FC-01)
``faults``         fault ledger counts
=================  ===============================================================
"""

from stormwatch.agent.collectors.base import Collector, CollectorSet, new_family
from stormwatch.agent.collectors.faults import FaultsCollector
from stormwatch.agent.collectors.gpu import GpuCollector
from stormwatch.agent.collectors.gpu_processes import GpuProcessesCollector
from stormwatch.agent.collectors.host import HostCollector
from stormwatch.agent.collectors.network import NetworkCollector
from stormwatch.agent.collectors.nvlink import NvlinkCollector
from stormwatch.agent.collectors.qdisc import QdiscCollector
from stormwatch.agent.collectors.ranks import RanksCollector
from stormwatch.agent.collectors.rendezvous import RendezvousCollector
from stormwatch.agent.collectors.trainer import TrainerCollector
from stormwatch.agent.collectors.xid import XidCollector

__all__ = [
    "Collector",
    "CollectorSet",
    "FaultsCollector",
    "GpuCollector",
    "GpuProcessesCollector",
    "HostCollector",
    "NetworkCollector",
    "NvlinkCollector",
    "QdiscCollector",
    "RanksCollector",
    "RendezvousCollector",
    "TrainerCollector",
    "XidCollector",
    "new_family",
]
