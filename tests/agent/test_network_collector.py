"""The ``network`` collector: node_exporter's netstat and netdev series from /proc/net."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stormwatch.agent import load_catalogue
from stormwatch.agent.collectors import CollectorSet, NetworkCollector
from stormwatch.agent.collectors.network import (
    NETDEV_FIELDS,
    NETSTAT_FIELDS,
    parse_proc_net_dev,
    parse_proc_net_stats,
)

# Shapes of the lab's node1 under packet_drop (Linux 6.18): IP packets received but not
# delivered (the node's own firewall dropped them), out-of-order TCP arrivals.
SNMP = """\
Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits
Ip: 1 64 50894 0 0 0 0 0 49980 51902 0 0 0 0 0 0 0 0 0 50941
Icmp: InMsgs InErrors InCsumErrors
Icmp: 3 0 0
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 26 5 0 2 31 49980 128218 207 0 4 0
"""
NETSTAT = """\
TcpExt: SyncookiesSent TCPLossProbes TCPTimeouts TCPOFOQueue TCPSynRetrans
TcpExt: 0 197 0 769 0
IpExt: InNoRoutes InOctets
IpExt: 0 249661917
"""
DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 900 10    0    0    0     0          0         0 900 10    0    0    0     0       0          0
  eth0: 113416628 18339    2    1    0     0          0         0 109122726 18389    0    3    0     0       0          0
"""


@pytest.fixture
def proc_net(tmp_path: Path) -> Path:
    for name, text in (("snmp", SNMP), ("netstat", NETSTAT), ("dev", DEV)):
        (tmp_path / name).write_text(text)
    return tmp_path


def _scrape(collector: NetworkCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of one collection."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CollectorSet([collector]))
    samples: dict[str, list[tuple[dict[str, str], float]]] = collections.defaultdict(list)
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    return samples


def test_netstat_fields_are_exported_under_node_exporters_names_untyped(proc_net: Path) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CollectorSet([NetworkCollector(proc_net)]))
    text = generate_latest(registry).decode()
    assert "# TYPE node_netstat_Ip_InReceives untyped\nnode_netstat_Ip_InReceives 50894.0\n" in text
    assert "node_netstat_Ip_InDelivers 49980.0\n" in text
    assert "node_netstat_Ip_OutTransmits 50941.0\n" in text
    assert "node_netstat_Tcp_RetransSegs 207.0\n" in text
    assert "node_netstat_TcpExt_TCPOFOQueue 769.0\n" in text
    assert "# HELP node_netstat_Tcp_RetransSegs Statistic TcpRetransSegs " in text
    assert "node_netstat_Tcp_RtoMin" not in text  # not a chosen field
    assert 'stormwatch_collector_up{collector="network"} 1.0' in text


def test_netdev_counters_are_exported_per_device(proc_net: Path) -> None:
    scrape = _scrape(NetworkCollector(proc_net))
    assert ({"device": "eth0"}, 2.0) in scrape["node_network_receive_errs_total"]
    assert ({"device": "eth0"}, 3.0) in scrape["node_network_transmit_drop_total"]
    assert ({"device": "lo"}, 900.0) in scrape["node_network_receive_bytes_total"]
    assert "node_network_receive_fifo_total" not in scrape


def test_a_field_of_a_newer_kernel_is_left_out_when_missing(proc_net: Path) -> None:
    (proc_net / "snmp").write_text(SNMP.replace(" OutTransmits", "").replace(" 50941\n", "\n"))
    scrape = _scrape(NetworkCollector(proc_net))
    assert "node_netstat_Ip_OutTransmits" not in scrape
    assert scrape["node_netstat_Ip_InReceives"] == [({}, 50894.0)]


def test_a_malformed_file_costs_only_this_collector(proc_net: Path) -> None:
    (proc_net / "snmp").write_text("Ip: InReceives InDelivers\nIp: 1\n")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CollectorSet([NetworkCollector(proc_net)]))
    text = generate_latest(registry).decode()
    assert 'stormwatch_collector_up{collector="network"} 0.0' in text
    assert "node_netstat_" not in text


def test_every_exported_name_is_catalogued_with_its_type() -> None:
    catalogue = load_catalogue()
    for key in NETSTAT_FIELDS:
        spec = catalogue[f"node_netstat_{key}"]
        assert (spec.type, spec.labels, spec.source) == ("untyped", (), "network")
    for field in NETDEV_FIELDS:
        spec = catalogue[f"node_network_{field}_total"]
        assert (spec.type, spec.labels, spec.source) == ("counter", ("device",), "network")


def test_this_namespaces_proc_net_parses_and_has_every_field_of_this_kernel() -> None:
    """The real files (Linux >= 6.3 here: Ip_OutTransmits included)."""
    stats = parse_proc_net_stats(Path("/proc/net/snmp").read_text())
    stats.update(parse_proc_net_stats(Path("/proc/net/netstat").read_text()))
    assert set(NETSTAT_FIELDS) <= set(stats)
    assert "lo" in parse_proc_net_dev(Path("/proc/net/dev").read_text())
