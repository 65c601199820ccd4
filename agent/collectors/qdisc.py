"""``qdisc`` collector: statistics of each network device's root queueing discipline, under
node_exporter's names (its ``qdisc`` collector, off by default there):
``node_qdisc_{bytes,packets,drops,requeues,overlimits}_total{device,kind}`` (counters) and
``node_qdisc_current_queue_length`` / ``node_qdisc_backlog`` (gauges, packets / bytes).

Read from the kernel with one rtnetlink dump (``RTM_GETQDISC``, what ``tc -s qdisc show``
does; no privilege needed) in the agent's network namespace, so the lab's agents each see
their node's. A shaping qdisc (``tbf``, ``htb``) counts ``overlimits`` when it holds a
packet back because its rate is used up: the per-node evidence of a bandwidth-starved link
(issue 18; the ``bandwidth_limit`` fault is a ``tbf`` on the node's ``eth0``: 630
overlimits/s on the lab against 0 on every healthy node, whose veths have ``noqueue``).
``StormwatchNodeBandwidthThrottled`` reads them.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import Metric

from stormwatch.agent.collectors.base import new_family

# linux/rtnetlink.h, linux/netlink.h, linux/pkt_sched.h, linux/gen_stats.h
RTM_NEWQDISC = 36
RTM_GETQDISC = 38
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
TCA_KIND = 1
TCA_STATS = 3
TCA_STATS2 = 7
TCA_STATS_BASIC = 1
TCA_STATS_QUEUE = 3
TC_H_ROOT = 0xFFFFFFFF

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_TCMSG = struct.Struct("=BxxxiIII")  # family, pad, ifindex, handle, parent, info
_RTATTR = struct.Struct("=HH")  # len, type
_QUEUE_FIELDS = ("qlen", "backlog", "drops", "requeues", "overlimits")  # gnet_stats_queue
_TC_STATS_FIELDS = ("bytes", "packets", "drops", "overlimits", "bps", "pps", "qlen", "backlog")


@dataclasses.dataclass(frozen=True)
class QdiscStats:
    """One qdisc's statistics, as the kernel reports them (``tc -s qdisc show``).

    Attributes:
        device: the network device's name (``eth0``).
        kind: the qdisc's kind (``noqueue``, ``fq_codel``, ``mq``, ``tbf``...).
        parent: the parent handle; :data:`TC_H_ROOT` for a device's root qdisc.
        bytes, packets: sent through it.
        drops: dropped by it; requeues: dequeued, not transmitted and requeued;
        overlimits: held back because a limit (a shaper's rate) was reached.
        qlen, backlog: packets and bytes queued now.
    """

    device: str
    kind: str
    parent: int
    bytes: int = 0
    packets: int = 0
    drops: int = 0
    requeues: int = 0
    overlimits: int = 0
    qlen: int = 0
    backlog: int = 0

    @property
    def root(self) -> bool:
        return self.parent == TC_H_ROOT


def _attributes(data: bytes) -> Iterator[tuple[int, bytes]]:
    """``(type, payload)`` of each rtattr in ``data`` (4-byte aligned)."""
    offset = 0
    while offset + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size:
            return
        yield kind & 0x3FFF, data[offset + _RTATTR.size : offset + length]  # no NLA_F_ flags
        offset += (length + 3) & ~3


def parse_qdisc_message(payload: bytes, ifname: Callable[[int], str]) -> QdiscStats:
    """One ``RTM_NEWQDISC`` payload (``struct tcmsg`` + attributes) -> :class:`QdiscStats`.

    ``TCA_STATS2`` (``gnet_stats_basic`` and ``gnet_stats_queue``) when present, else the
    legacy ``TCA_STATS`` (``struct tc_stats``, no requeues), as node_exporter's reader.

    Raises:
        ValueError: the payload is shorter than ``struct tcmsg``.
    """
    if len(payload) < _TCMSG.size:
        raise ValueError(f"short RTM_NEWQDISC message ({len(payload)} bytes)")
    _, ifindex, _, parent, _ = _TCMSG.unpack_from(payload)
    fields: dict[str, int] = {}
    kind = ""
    legacy: dict[str, int] = {}
    for attr, data in _attributes(payload[_TCMSG.size :]):
        if attr == TCA_KIND:
            kind = data.split(b"\0", 1)[0].decode("ascii", "replace")
        elif attr == TCA_STATS2:
            for nested, value in _attributes(data):
                if nested == TCA_STATS_BASIC and len(value) >= 12:
                    fields["bytes"], fields["packets"] = struct.unpack_from("=QI", value)
                elif nested == TCA_STATS_QUEUE and len(value) >= 20:
                    fields.update(zip(_QUEUE_FIELDS, struct.unpack_from("=5I", value), strict=True))
        elif attr == TCA_STATS and len(data) >= 36:
            values = struct.unpack_from("=QIIIIIII", data)
            legacy = dict(zip(_TC_STATS_FIELDS, values, strict=True))
            del legacy["bps"], legacy["pps"]
    return QdiscStats(device=ifname(ifindex), kind=kind, parent=parent, **(fields or legacy))


def _ifname(index: int) -> str:
    try:
        return socket.if_indextoname(index)
    except OSError:  # the device went away between the dump and now
        return str(index)


def dump_qdiscs(timeout: float = 2.0) -> list[QdiscStats]:
    """Every qdisc of this network namespace, from one rtnetlink dump.

    Raises:
        OSError: the netlink socket failed, or the kernel answered an error.
    """
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(timeout)
        sock.bind((0, 0))
        seq = 1
        tcmsg = _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        header = _NLMSGHDR.pack(
            _NLMSGHDR.size + len(tcmsg), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
        )
        sock.send(header + tcmsg)
        found: list[QdiscStats] = []
        while True:
            data = sock.recv(65536)
            offset = 0
            while offset + _NLMSGHDR.size <= len(data):
                length, kind, _, got_seq, _ = _NLMSGHDR.unpack_from(data, offset)
                if length < _NLMSGHDR.size:
                    raise OSError("malformed netlink message")
                payload = data[offset + _NLMSGHDR.size : offset + length]
                offset += (length + 3) & ~3
                if got_seq != seq:
                    continue
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    (error,) = struct.unpack_from("=i", payload)
                    if error:
                        raise OSError(-error, os.strerror(-error))
                    continue
                if kind == RTM_NEWQDISC:
                    found.append(parse_qdisc_message(payload, _ifname))


class QdiscCollector:
    """node_exporter's ``node_qdisc_*`` series of every device's root qdisc.

    Args:
        dump: returns the namespace's qdiscs (default :func:`dump_qdiscs`; a test passes
            its own).
    """

    name = "qdisc"

    def __init__(self, dump: Callable[[], Sequence[QdiscStats]] = dump_qdiscs) -> None:
        self._dump = dump

    def collect(self) -> Iterator[Metric]:
        roots = sorted((q for q in self._dump() if q.root), key=lambda q: q.device)
        for name, field in (
            ("node_qdisc_bytes_total", "bytes"),
            ("node_qdisc_packets_total", "packets"),
            ("node_qdisc_drops_total", "drops"),
            ("node_qdisc_requeues_total", "requeues"),
            ("node_qdisc_overlimits_total", "overlimits"),
            ("node_qdisc_current_queue_length", "qlen"),
            ("node_qdisc_backlog", "backlog"),
        ):
            family = new_family(name)
            for qdisc in roots:
                family.add_metric([qdisc.device, qdisc.kind], float(getattr(qdisc, field)))
            yield family


__all__ = ["QdiscCollector", "QdiscStats", "dump_qdiscs", "parse_qdisc_message"]
