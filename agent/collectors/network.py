"""``network`` collector: the kernel's network counters of the agent's network namespace,
under node_exporter's names (its ``netstat`` and ``netdev`` collectors), so rules and
dashboards written for node_exporter read them unchanged.

* ``/proc/net/snmp`` and ``/proc/net/netstat`` -> ``node_netstat_<Proto>_<Field>``
  (``untyped``, no labels, help ``Statistic <Proto><Field>.``, as node_exporter): the fields
  of :data:`NETSTAT_FIELDS` that the kernel has (``Ip_OutTransmits`` is Linux 6.3+).
* ``/proc/net/dev`` -> ``node_network_<field>_total{device}`` (counters, help ``Network
  device statistic <field>.``): the fields of :data:`NETDEV_FIELDS`, every device.

``/proc/net`` is the reading process's own namespace (``/proc/self/net``), so an agent
per node reads that node's counters: on a host network namespace (the Kubernetes
DaemonSet's ``hostNetwork: true``, a Slurm node) the host's, in the lab the node's
namespace. These say which node's own stack loses packets (issue 18; docs/runbooks.md
``StormwatchNodePacketLoss``); the qdisc collector says which one's link is throttled.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from prometheus_client.core import Metric

from stormwatch.agent.collectors.base import new_family

#: The ``/proc/net/{snmp,netstat}`` fields exported, as ``<Proto>_<Field>`` (node_exporter's
#: key). The IP ones give the packets the node's own stack received and neither delivered
#: nor forwarded (firewall and conntrack drops, header and address errors: the
#: ``StormwatchNodePacketLoss`` rule), the TCP ones what the connections saw (retransmits,
#: tail-loss probes, which a healthy loaded node sends every second, timeouts, out-of-order
#: arrivals: a node whose incoming packets are lost sees them).
NETSTAT_FIELDS: tuple[str, ...] = (
    "Ip_InReceives",
    "Ip_InDelivers",
    "Ip_ForwDatagrams",
    "Ip_InDiscards",
    "Ip_InHdrErrors",
    "Ip_InAddrErrors",
    "Ip_ReasmReqds",
    "Ip_ReasmOKs",
    "Ip_OutRequests",
    "Ip_OutDiscards",
    "Ip_OutNoRoutes",
    "Ip_OutTransmits",
    "Tcp_CurrEstab",
    "Tcp_InSegs",
    "Tcp_OutSegs",
    "Tcp_RetransSegs",
    "Tcp_InErrs",
    "Tcp_OutRsts",
    "TcpExt_TCPLossProbes",
    "TcpExt_TCPTimeouts",
    "TcpExt_TCPOFOQueue",
    "TcpExt_TCPSynRetrans",
)

#: The ``/proc/net/dev`` columns, in file order (node_exporter's names).
NETDEV_COLUMNS: tuple[str, ...] = (
    "receive_bytes",
    "receive_packets",
    "receive_errs",
    "receive_drop",
    "receive_fifo",
    "receive_frame",
    "receive_compressed",
    "receive_multicast",
    "transmit_bytes",
    "transmit_packets",
    "transmit_errs",
    "transmit_drop",
    "transmit_fifo",
    "transmit_colls",
    "transmit_carrier",
    "transmit_compressed",
)
#: The columns exported: traffic, and the device's own errors and drops.
NETDEV_FIELDS: tuple[str, ...] = (
    "receive_bytes",
    "receive_packets",
    "receive_errs",
    "receive_drop",
    "transmit_bytes",
    "transmit_packets",
    "transmit_errs",
    "transmit_drop",
)


def parse_proc_net_stats(text: str) -> dict[str, float]:
    """``/proc/net/snmp`` or ``/proc/net/netstat`` text -> ``{"<Proto>_<Field>": value}``.

    Both files hold pairs of lines, ``Proto: Field ...`` then ``Proto: value ...``.

    Raises:
        ValueError: a pair whose name and value counts differ, or a value that is not a number.
    """
    stats: dict[str, float] = {}
    lines = [line for line in text.splitlines() if line.strip()]
    for names_line, values_line in zip(lines[::2], lines[1::2], strict=False):
        proto, _, names = names_line.partition(":")
        proto_again, _, values = values_line.partition(":")
        names_list, values_list = names.split(), values.split()
        if proto != proto_again or len(names_list) != len(values_list):
            raise ValueError(f"mismatched field count for {proto!r}")
        for name, value in zip(names_list, values_list, strict=True):
            stats[f"{proto}_{name}"] = float(value)
    return stats


def parse_proc_net_dev(text: str) -> dict[str, dict[str, float]]:
    """``/proc/net/dev`` text -> ``{device: {column: value}}`` (:data:`NETDEV_COLUMNS`).

    Raises:
        ValueError: a device line with fewer columns than :data:`NETDEV_COLUMNS`.
    """
    devices: dict[str, dict[str, float]] = {}
    for line in text.splitlines()[2:]:  # two header lines
        device, sep, rest = line.partition(":")
        if not sep:
            continue
        values = rest.split()
        if len(values) < len(NETDEV_COLUMNS):
            raise ValueError(f"/proc/net/dev: {device.strip()!r} has {len(values)} columns")
        devices[device.strip()] = {
            column: float(value) for column, value in zip(NETDEV_COLUMNS, values, strict=False)
        }
    return devices


class NetworkCollector:
    """node_exporter's netstat and netdev series of this network namespace.

    Args:
        proc_net: the folder holding ``snmp``, ``netstat`` and ``dev`` (``/proc/net``;
            a test passes a folder of its own).
    """

    name = "network"

    def __init__(self, proc_net: Path = Path("/proc/net")) -> None:
        self._proc_net = proc_net

    def collect(self) -> Iterator[Metric]:
        stats = parse_proc_net_stats((self._proc_net / "snmp").read_text())
        stats.update(parse_proc_net_stats((self._proc_net / "netstat").read_text()))
        devices = parse_proc_net_dev((self._proc_net / "dev").read_text())
        yield from _netstat_families(stats)
        yield from _netdev_families(devices)


def _netstat_families(stats: Mapping[str, float]) -> Iterator[Metric]:
    for key in NETSTAT_FIELDS:
        if key in stats:  # a field of a newer kernel (Ip_OutTransmits) may be missing
            family = new_family(f"node_netstat_{key}")
            family.add_metric([], stats[key])
            yield family


def _netdev_families(devices: Mapping[str, Mapping[str, float]]) -> Iterator[Metric]:
    for field in NETDEV_FIELDS:
        family = new_family(f"node_network_{field}_total")
        for device in sorted(devices):
            family.add_metric([device], devices[device][field])
        yield family


__all__ = ["NETDEV_FIELDS", "NETSTAT_FIELDS", "NetworkCollector"]
