"""The ``qdisc`` collector: node_exporter's node_qdisc_* series from an rtnetlink dump."""

from __future__ import annotations

import struct

from prometheus_client import CollectorRegistry, generate_latest

from stormwatch.agent import load_catalogue
from stormwatch.agent.collectors import CollectorSet, QdiscCollector
from stormwatch.agent.collectors.qdisc import (
    TC_H_ROOT,
    QdiscStats,
    dump_qdiscs,
    parse_qdisc_message,
)

#: A real RTM_NEWQDISC payload (Linux 6.18): ``tc qdisc replace dev va root handle 1: tbf rate
#: 1mbit burst 4kb latency 20ms`` on a veth, then 300 UDP datagrams of 1000 bytes sent through
#: it (``tc -s`` said: dropped 290, overlimits 309).
TBF_MESSAGE = bytes.fromhex(
    "000000000300000000000100ffffffff0300000008000100746266002c0002002800010000010000"
    "0000000048e80100000000000000000000000000c419000000d007000000000005000c0000000000"
    "3000070014000100be290000000000000d0000000000000018000300000000000000000022010000"
    "00000000350100002c000300be290000000000000d00000022010000350100000000000000000000"
    "000000000000000000000000"
)


def test_a_kernel_tbf_message_parses_to_what_tc_shows() -> None:
    stats = parse_qdisc_message(TBF_MESSAGE, lambda index: {3: "va"}[index])
    assert stats == QdiscStats(
        device="va",
        kind="tbf",
        parent=TC_H_ROOT,
        bytes=10686,
        packets=13,
        drops=290,
        requeues=0,
        overlimits=309,
        qlen=0,
        backlog=0,
    )
    assert stats.root


def test_the_legacy_tc_stats_attribute_is_read_when_stats2_is_absent() -> None:
    tcmsg = struct.pack("=BxxxiIII", 0, 7, 0x10000, TC_H_ROOT, 1)
    kind = struct.pack("=HH", 4 + 4, 1) + b"htb\0"
    legacy = struct.pack("=QIIIIIII", 5000, 40, 2, 9, 0, 0, 1, 1500)
    stats_attr = struct.pack("=HH", 4 + len(legacy), 3) + legacy
    stats = parse_qdisc_message(tcmsg + kind + stats_attr, lambda index: f"if{index}")
    assert (stats.device, stats.kind, stats.bytes, stats.packets) == ("if7", "htb", 5000, 40)
    assert (stats.drops, stats.overlimits, stats.qlen, stats.backlog) == (2, 9, 1, 1500)


def _text(dump: list[QdiscStats]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CollectorSet([QdiscCollector(lambda: dump)]))
    return generate_latest(registry).decode()


def test_root_qdiscs_are_exported_under_node_exporters_names() -> None:
    text = _text(
        [
            QdiscStats("eth0", "tbf", TC_H_ROOT, bytes=10, packets=2, drops=1, overlimits=630),
            QdiscStats("eth0", "pfifo", 0x10001, packets=99),  # a child of the tbf: left out
            QdiscStats("lo", "noqueue", TC_H_ROOT),
        ]
    )
    assert 'node_qdisc_overlimits_total{device="eth0",kind="tbf"} 630.0' in text
    assert 'node_qdisc_packets_total{device="eth0",kind="tbf"} 2.0' in text
    assert 'node_qdisc_backlog{device="lo",kind="noqueue"} 0.0' in text
    assert "# TYPE node_qdisc_current_queue_length gauge" in text
    assert 'kind="pfifo"' not in text
    assert 'stormwatch_collector_up{collector="qdisc"} 1.0' in text


def test_a_failing_dump_costs_only_this_collector() -> None:
    def refused() -> list[QdiscStats]:
        raise PermissionError("netlink refused")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(CollectorSet([QdiscCollector(refused)]))
    text = generate_latest(registry).decode()
    assert 'stormwatch_collector_up{collector="qdisc"} 0.0' in text


def test_every_exported_name_is_catalogued() -> None:
    catalogue = load_catalogue()
    names = {spec.name for spec in catalogue.by_source("qdisc")}
    assert names == {
        "node_qdisc_bytes_total",
        "node_qdisc_packets_total",
        "node_qdisc_drops_total",
        "node_qdisc_requeues_total",
        "node_qdisc_overlimits_total",
        "node_qdisc_current_queue_length",
        "node_qdisc_backlog",
    }
    assert all(catalogue[name].labels == ("device", "kind") for name in names)


def test_this_namespaces_dump_has_the_loopbacks_root_qdisc() -> None:
    """A real dump (no privilege needed): every device has a root qdisc, lo's is noqueue."""
    found = {q.device: q for q in dump_qdiscs() if q.root}
    assert found["lo"].kind == "noqueue"
    assert found["lo"].parent == TC_H_ROOT
