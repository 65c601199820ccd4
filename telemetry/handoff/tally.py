"""Per-collective telemetry as plain numbers: what a rank's collectives add up to between
two flushes, and per step.

:class:`CollectiveTally` is what a rank's :class:`~stormwatch.telemetry.rank.RankTelemetry`
records each collective into, on the thread that issued it: one slot per ``op`` (calls,
input bytes, issue-to-completion seconds) and one per ``(mesh_dim, op)`` (nccl-tests size,
latency histogram bucket counts and sum; and this step's size, seconds and group size for
the bandwidth gauges), each a preallocated list of floats changed in place under one
lock (~1 us a collective). The flusher (:mod:`stormwatch.telemetry.handoff.flusher`) takes the
totals (:meth:`CollectiveTally.take`) and adds them to the prometheus-client counters and
histogram with one write per series; the step mark takes the step's
(:meth:`CollectiveTally.take_step`). The metrics are those of the same collectives
written one by one (``tests/telemetry/test_hot_path.py``). No torch import here.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class OpTotals:
    """What the collectives of one ``op`` added up to since the last :meth:`CollectiveTally.take`.

    Attributes:
        op: the op's label.
        calls: collectives issued.
        nbytes: their input bytes on this rank.
        seconds: their issue-to-completion seconds (completed ones).
    """

    op: str
    calls: int
    nbytes: float
    seconds: float


@dataclass(frozen=True)
class LatencyTotals:
    """What the completed collectives of one ``(mesh_dim, op)`` added up to.

    Attributes:
        mesh_dim / op: the labels.
        size: their nccl-tests sizes, bytes.
        buckets: per latency bucket (the histogram's upper bounds, +Inf last), how many
            fell in it (non-cumulative: the first bound >= the latency, as ``observe()``).
        total: the sum of their latencies, seconds.
    """

    mesh_dim: str
    op: str
    size: float
    buckets: tuple[int, ...]
    total: float


class CollectiveTally:
    """Per-op and per-``(mesh_dim, op)`` totals of a rank's collectives (module docstring).

    Args:
        bounds: the latency histogram's upper bounds, seconds, ascending (+Inf added).
    """

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = [*bounds, float("inf")] if bounds[-1] != float("inf") else list(bounds)
        self._lock = threading.Lock()
        self._ops: dict[str, list[float]] = {}  # op -> [calls, bytes, seconds]
        # (mesh_dim, op) -> [size, sum, bucket counts...]
        self._latency: dict[tuple[str, str], list[float]] = {}
        # (mesh_dim, op) -> [size, seconds, group size] of this step
        self._step: dict[tuple[str, str], list[float]] = {}

    def issued(self, op: str, nbytes: int) -> None:
        """One collective ``op`` of ``nbytes`` input bytes was issued."""
        with self._lock:
            slot = self._ops.get(op)
            if slot is None:
                slot = self._ops[op] = [0.0, 0.0, 0.0]
            slot[0] += 1
            slot[1] += nbytes

    def completed(self, op: str, seconds: float) -> None:
        """A collective ``op`` completed ``seconds`` (clamped at 0) after its issue."""
        with self._lock:
            slot = self._ops.get(op)
            if slot is None:
                slot = self._ops[op] = [0.0, 0.0, 0.0]
            slot[2] += max(seconds, 0.0)

    def observed(self, mesh_dim: str, op: str, *, size: int, seconds: float, group: int) -> None:
        """A collective of ``(mesh_dim, op)``, nccl-tests size ``size`` bytes, group of
        ``group`` ranks, took ``seconds`` (clamped at 0 for the histogram)."""
        latency = max(seconds, 0.0)
        index = bisect.bisect_left(self._bounds, latency) if latency == latency else -1
        key = (mesh_dim, op)
        with self._lock:
            slot = self._latency.get(key)
            if slot is None:
                slot = self._latency[key] = [0.0] * (len(self._bounds) + 2)
            slot[0] += size
            slot[1] += latency
            if index >= 0:  # NaN: in the sum only, as observe()
                slot[2 + index] += 1
            step = self._step.get(key)
            if step is None:
                step = self._step[key] = [0.0, 0.0, float(group)]
            step[0] += size
            step[1] += seconds

    def take(self) -> tuple[list[OpTotals], list[LatencyTotals]]:
        """The totals since the last call (and forget them)."""
        with self._lock:
            ops, self._ops = self._ops, {}
            latency, self._latency = self._latency, {}
        return (
            [OpTotals(op, int(s[0]), s[1], s[2]) for op, s in ops.items()],
            [
                LatencyTotals(dim, op, s[0], tuple(int(n) for n in s[2:]), s[1])
                for (dim, op), s in latency.items()
            ],
        )

    def take_step(self) -> dict[tuple[str, str], tuple[float, float, int]]:
        """``(mesh_dim, op)`` -> (size bytes, seconds, group size) of the collectives
        observed since the last call (the step's, for the bandwidth gauges)."""
        with self._lock:
            step, self._step = self._step, {}
        return {key: (s[0], s[1], int(s[2])) for key, s in step.items()}


__all__ = ["CollectiveTally", "LatencyTotals", "OpTotals"]
