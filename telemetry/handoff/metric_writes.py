"""Writes into one rank's prometheus-client metrics, now or in batches.

:class:`MetricWriter` owns the metric objects of :data:`~stormwatch.telemetry.metrics.CATALOGUE`
and the children of one ``(training_job, rank)``, looked up once per label set (a
``labels()`` call costs ~10 us; a cached child nothing). It takes three kinds of update:
``set`` (a gauge: the last value wins), ``inc`` (a counter) and ``observe`` (a histogram).

Deferred (``deferred=True``, what a trainer rank uses): an update only changes plain
Python numbers in memory, under one lock (~0.5 us): the gauge's latest value, the
counter's sum, the histogram's per-bucket counts and sum; :meth:`MetricWriter.flush`
writes what accumulated into the multiprocess files in one go (one ``set`` per gauge, one
``inc`` per counter, one ``inc`` per touched bucket), from a background thread
(:class:`~stormwatch.telemetry.handoff.flusher.Flusher`) or from the caller at a moment that must
be visible at once (start, phase, checkpoint, done). Exposition after a flush is exactly
what the same updates made one by one would give: a gauge keeps the last value, counters
and histogram sums add up (floating-point sums are added in another order: equal to the
last bits), bucket counts are integers.

A flush skips what would not change a file: a gauge set to the value it last wrote (the
world size, the learning rate between schedule steps, a constant MFU: most of a step's
gauges) and an ``inc`` of 0 to a series that exists; each write is a lock, a pid check and
an mmap write in prometheus-client (~3 us), ~25 of them per step.

Not deferred: every update is written at once (the write-through of
:class:`~stormwatch.telemetry.metrics.RankMetrics` used by benchmarks and tools).

The histogram batch uses prometheus-client's per-bucket values (``_buckets``, ``_sum``
of a ``Histogram`` child, unchanged since 0.4 and in 0.21+); ``tests/telemetry/test_metric_writes.py``
checks the exposition against ``observe()`` one by one. No torch import here.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

#: (metric name, extra label values after training_job and rank)
Key = tuple[str, tuple[str, ...]]


class MetricWriter:
    """The catalogue's metrics of one ``(job, rank)`` and their pending updates.

    Args:
        metrics: metric name -> the prometheus-client object (from the catalogue).
        base_labels: the ``training_job`` and ``rank`` label values, in that order.
        deferred: hold updates in memory until :meth:`flush` (see the module docstring).
    """

    def __init__(
        self,
        metrics: dict[str, Gauge | Counter | Histogram],
        base_labels: tuple[str, str],
        *,
        deferred: bool,
    ) -> None:
        self._metrics = metrics
        self._base = base_labels
        self.deferred = deferred
        self._children: dict[Key, Any] = {}
        # upper bounds (with +Inf) of each histogram, for the bucket of a value
        self._bounds: dict[str, list[float]] = {
            name: list(m._upper_bounds) for name, m in metrics.items() if isinstance(m, Histogram)
        }
        self._lock = threading.Lock()  # the pending dicts
        self._flush_lock = threading.Lock()  # one flush at a time, in order
        self._sets: dict[Key, float] = {}
        self._incs: dict[Key, float] = {}
        self._observed: dict[Key, list[float]] = {}  # bucket counts..., then the sum
        self._written: dict[Key, float] = {}  # each gauge's value in its file (flush)

    def _child(self, key: Key) -> Any:
        child = self._children.get(key)
        if child is None:
            child = self._metrics[key[0]].labels(*self._base, *key[1])
            self._children[key] = child
        return child

    # ------------------------------------------------------------------ updates
    def set(self, name: str, value: float, *extra: str) -> None:
        """Set gauge ``name`` (label values ``extra`` after job and rank) to ``value``."""
        key = (name, extra)
        if not self.deferred:
            self._child(key).set(value)
            with self._flush_lock:
                self._written[key] = value
            return
        with self._lock:
            self._sets[key] = value

    def inc(self, name: str, amount: float, *extra: str) -> None:
        """Add ``amount`` (>= 0; 0 makes the series exist) to counter ``name``."""
        key = (name, extra)
        if not self.deferred:
            self._child(key).inc(amount)
            return
        with self._lock:
            self._incs[key] = self._incs.get(key, 0.0) + amount

    def observe(self, name: str, value: float, *extra: str) -> None:
        """One observation ``value`` of histogram ``name``."""
        key = (name, extra)
        if not self.deferred:
            self._child(key).observe(value)
            return
        bounds = self._bounds[name]
        # the first bound >= value, as observe(); NaN: in no bucket, only in the sum
        index = bisect.bisect_left(bounds, value) if value == value else len(bounds)
        with self._lock:
            slots = self._observed.get(key)
            if slots is None:
                slots = self._observed[key] = [0.0] * (len(bounds) + 1)
            slots[index] += 1
            slots[-1] += value

    def observe_many(self, name: str, buckets: Sequence[int], total: float, *extra: str) -> None:
        """Observations of histogram ``name`` counted elsewhere: ``buckets[i]`` of them in
        bucket ``i`` (non-cumulative, +Inf last), their values summing to ``total``."""
        key = (name, extra)
        if not self.deferred:
            _add_observations(self._child(key), [*buckets, total])
            return
        with self._lock:
            slots = self._observed.get(key)
            if slots is None:
                slots = self._observed[key] = [0.0] * (len(self._bounds[name]) + 1)
            for index, count in enumerate(buckets):
                slots[index] += count
            slots[-1] += total

    # ------------------------------------------------------------------ flushing
    @property
    def pending(self) -> bool:
        """Whether updates wait for :meth:`flush`."""
        return bool(self._sets or self._incs or self._observed)

    def flush(self) -> None:
        """Write the pending updates into the multiprocess files (any thread; in order).

        Raises:
            Exception: what prometheus-client raised (the updates not yet written stay
                taken: a failing write is counted by the caller, not retried forever).
        """
        if not self.pending:
            return
        with self._flush_lock:
            with self._lock:
                sets, self._sets = self._sets, {}
                incs, self._incs = self._incs, {}
                observed, self._observed = self._observed, {}
            written = self._written
            for key, value in sets.items():
                if written.get(key) == value:  # NaN never equals: written again
                    continue
                self._child(key).set(value)
                written[key] = value
            for key, amount in incs.items():
                if amount == 0 and key in self._children:  # the series exists already
                    continue
                self._child(key).inc(amount)
            for key, slots in observed.items():
                _add_observations(self._child(key), slots)


def _add_observations(child: Any, slots: Sequence[float]) -> None:
    """Add bucket counts ``slots[:-1]`` and the sum ``slots[-1]`` to a histogram child
    (prometheus-client's per-bucket values: see the module docstring)."""
    child._sum.inc(slots[-1])
    for index, count in enumerate(slots[:-1]):
        if count:
            child._buckets[index].inc(count)


__all__ = ["Key", "MetricWriter"]
