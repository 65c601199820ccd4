"""Link faults on the node's interface (``eth0`` by default): a rate limit and a flapping link.

* ``bandwidth_limit``: a token-bucket filter (``tc qdisc ... root tbf``) caps
  the node's egress at ``rate_kbit``: a NIC negotiated down, a congested
  uplink, a mis-set switch policer. The collectives' bus bandwidth drops
  (``StormwatchCollectiveBusBandwidthDrop``). The qdisc carries a handle derived
  from the fault id, so revert deletes it only when it is still this fault's,
  and checks it is gone. Injecting again replaces it (one effect).
* ``link_flap``: the interface goes down for ``down_seconds`` every
  ``period_seconds`` (a flapping port or a failing transceiver); one period longer
  than the TTL cuts the node off once for ``down_seconds`` (a pulled cable). A thread
  of the agent does it, starting ``delay_seconds`` after the inject so that the
  agent's answer leaves over the link first, and stops at the TTL by itself; revert
  stops it, sets the link up and restores the routes through it (IPv4 drops them
  when the link goes down; they are recorded at inject, so revert works from the
  ledger). While the link is down the agent cannot be reached: a revert retries
  for a few seconds, and the agent's TTL heals it in any case.

``device`` is for callers of the agent's API only: an experiment file acts on
the default interface.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Literal

from pydantic import Field

from stormwatch.faults.base import Fault, FaultRequest, Injection, Problem
from stormwatch.faults.errors import FaultError
from stormwatch.faults.kind import DetectClass, FaultKind, Placement, Target, Traits
from stormwatch.faults.node import FaultContext
from stormwatch.faults.system import run, short_tag
from stormwatch.faults.targeting import NodeOrRank

log = logging.getLogger(__name__)

_DEVICE = Field(default="eth0", pattern=r"^[A-Za-z0-9_.@-]{1,15}$")


class BandwidthLimitRequest(FaultRequest):
    """``bandwidth_limit``: ``rate_kbit``, ``burst_bytes`` (32 KiB), ``latency_ms`` (50), ``device``."""

    kind: Literal["bandwidth_limit"]
    rate_kbit: int = Field(ge=8, le=100_000_000)
    burst_bytes: int = Field(default=32_768, ge=1_600, le=1 << 30)
    latency_ms: float = Field(default=50.0, gt=0, le=10_000)
    device: str = _DEVICE


def _down_within_period(fault: Any) -> Problem | None:
    if fault.down_seconds >= fault.period_seconds:
        return ("down_seconds", "must be shorter than period_seconds")
    return None


class LinkFlapRequest(FaultRequest):
    """``link_flap``: ``period_seconds`` (4), ``down_seconds`` (1), ``device``,
    ``delay_seconds`` (0.5: the inject's answer leaves before the link goes down, as for
    ``kill_agent``; not in experiment files)."""

    kind: Literal["link_flap"]
    period_seconds: float = Field(default=4.0, gt=0, le=3600)
    down_seconds: float = Field(default=1.0, gt=0, le=3600)
    device: str = _DEVICE
    delay_seconds: float = Field(default=0.5, ge=0, le=60)

    checks = (_down_within_period,)


def _handle(fault_id: str) -> str:
    """A tc major handle (hex, 0x10..0xfffe) derived from the fault id."""
    return f"{int(short_tag(fault_id, 8), 16) % 0xFFEE + 0x10:x}:"


def _root_qdisc(device: str) -> dict[str, object] | None:
    out = run(["tc", "-j", "qdisc", "show", "dev", device]).stdout
    for qdisc in json.loads(out or "[]"):
        if qdisc.get("root"):
            return dict(qdisc)
    return None


class BandwidthLimit(Fault[BandwidthLimitRequest]):
    """``tc qdisc replace dev D root handle H: tbf rate R burst B latency L``."""

    def prepare(self, ctx: FaultContext) -> None:
        run(["ip", "link", "show", "dev", self.request.device])  # a typo fails here, not later

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.request
        handle = _handle(spec.id)
        run(
            [
                "tc", "qdisc", "replace", "dev", spec.device, "root", "handle", handle, "tbf",
                "rate", f"{spec.rate_kbit}kbit", "burst", str(spec.burst_bytes),
                "latency", f"{spec.latency_ms:g}ms",
            ]
        )  # fmt: skip
        return Injection(details={"device": spec.device, "handle": handle})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Delete the root qdisc if it is this fault's; then :meth:`verify`.

        Raises:
            FaultError: the qdisc is still there.
        """
        spec = self.request
        root = _root_qdisc(spec.device)
        if root is not None and root.get("handle") == _handle(spec.id):
            run(["tc", "qdisc", "del", "dev", spec.device, "root"])
            self.verify(ctx, injection)

    def verify(self, ctx: FaultContext, injection: Injection | None) -> None:
        """The device's root qdisc is not this fault's.

        Raises:
            FaultError: it still is.
        """
        spec = self.request
        handle = _handle(spec.id)
        root = _root_qdisc(spec.device)
        if root is not None and root.get("handle") == handle:
            raise FaultError(f"tbf qdisc {handle} is still on {spec.device}")


#: Running flap threads by fault id: revert stops the one of its fault. A restarted
#: agent has none (they died with it); revert then only sets the link up.
_FLAPPERS: dict[str, tuple[threading.Thread, threading.Event]] = {}
_FLAPPERS_LOCK = threading.Lock()


def _routes(device: str) -> list[str]:
    return [
        line.strip()
        for line in run(["ip", "-4", "-o", "route", "show", "dev", device]).stdout.splitlines()
        if line.strip()
    ]


def _up(device: str, routes: list[str]) -> None:
    run(["ip", "link", "set", "dev", device, "up"])
    for route in routes:
        run(["ip", "route", "replace", *route.split(), "dev", device], check=False)


class LinkFlap(Fault[LinkFlapRequest]):
    """A daemon thread toggles the link until the TTL or revert."""

    def prepare(self, ctx: FaultContext) -> None:
        run(["ip", "link", "show", "dev", self.request.device])

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.request
        routes = _routes(spec.device)
        stop = threading.Event()
        thread = threading.Thread(
            target=self._flap,
            args=(routes, stop, time.monotonic() + spec.ttl_seconds),
            name=f"stormwatch-link-flap-{spec.id}",
            daemon=True,
        )
        with _FLAPPERS_LOCK:
            if spec.id in _FLAPPERS:  # the same fault again: one effect
                return Injection(details={"device": spec.device, "routes": routes})
            _FLAPPERS[spec.id] = (thread, stop)
        thread.start()
        return Injection(details={"device": spec.device, "routes": routes})

    def _flap(self, routes: list[str], stop: threading.Event, deadline: float) -> None:
        spec = self.request
        try:
            stop.wait(min(spec.delay_seconds, max(0.0, deadline - time.monotonic())))
            while not stop.is_set() and time.monotonic() < deadline:
                run(["ip", "link", "set", "dev", spec.device, "down"])
                stop.wait(min(spec.down_seconds, max(0.0, deadline - time.monotonic())))
                _up(spec.device, routes)
                stop.wait(min(spec.period_seconds - spec.down_seconds, deadline - time.monotonic()))
        except FaultError as exc:
            log.error("link_flap %s: %s", spec.id, exc)
        finally:
            try:
                _up(spec.device, routes)
            except FaultError as exc:
                log.error("link_flap %s: cannot set %s up: %s", spec.id, spec.device, exc)

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Stop the flapping, set the link up, restore its routes; then :meth:`verify`.

        Raises:
            FaultError: the link is not up afterwards, or a route is missing.
        """
        spec = self.request
        with _FLAPPERS_LOCK:
            running = _FLAPPERS.pop(spec.id, None)
        if running is not None:
            running[1].set()
            running[0].join(timeout=10)
        _up(spec.device, _recorded_routes(injection))
        self.verify(ctx, injection)

    def verify(self, ctx: FaultContext, injection: Injection | None) -> None:
        """The link is up and every route recorded at inject goes through it again.

        Raises:
            FaultError: naming what is not back.
        """
        spec = self.request
        shown = json.loads(run(["ip", "-j", "link", "show", "dev", spec.device]).stdout or "[]")
        if not shown or "UP" not in shown[0].get("flags", []):
            raise FaultError(f"{spec.device} is not up after reverting link_flap")
        present = {r.split()[0] for r in _routes(spec.device)}
        missing = [r for r in _recorded_routes(injection) if r.split()[0] not in present]
        if missing:
            raise FaultError(f"routes through {spec.device} not restored: {missing}")


def _recorded_routes(injection: Injection | None) -> list[str]:
    return list(injection.details.get("routes", [])) if injection else []


BANDWIDTH_LIMIT = FaultKind(
    kind="bandwidth_limit",
    summary=(
        "Token-bucket rate limit (``tc tbf``) on the node's link: a degraded NIC or a congested "
        "uplink. ``rate_kbit``: kilobits per second."
    ),
    traits=Traits(
        target=Target.NODE_OR_RANK,
        placement=Placement.ONE_NODE,
        detect_class=DetectClass.BANDWIDTH_STARVED,
        needs_root=True,
    ),
    targeting=NodeOrRank,
    request=BandwidthLimitRequest,
    fault=BandwidthLimit,
    agent_only=frozenset({"device"}),
)
LINK_FLAP = FaultKind(
    kind="link_flap",
    summary=(
        "The node's link goes down for ``down_seconds`` every ``period_seconds`` (a flapping "
        "port); it is up again at the end."
    ),
    traits=Traits(
        target=Target.NODE_OR_RANK,
        placement=Placement.ONE_NODE,
        category="network_switch_cable",  # a lost link between nodes
        # while its link is down the node is cut off: its agent cannot report
        detect_class=DetectClass.NODE_DOWN,
        needs_root=True,
    ),
    targeting=NodeOrRank,
    request=LinkFlapRequest,
    fault=LinkFlap,
    agent_only=frozenset({"device", "delay_seconds"}),
)

__all__ = [
    "BANDWIDTH_LIMIT",
    "LINK_FLAP",
    "BandwidthLimit",
    "BandwidthLimitRequest",
    "LinkFlap",
    "LinkFlapRequest",
]
