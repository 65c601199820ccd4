"""Exact sums and the exact merge of prometheus-client multiprocess files.

prometheus-client merges the files of a multiprocess folder by adding a series' values
one file at a time (``MultiProcessCollector._accumulate_metrics``), so a total depends on
the order of the files, and on how it is split among them, by a few ulps: enough for
Prometheus to take a counter for reset (any decrease is one). :func:`merge` is the
library's merge with each series' values summed by ``math.fsum`` first (correctly
rounded, order-free), reading and accumulating with the library itself; :func:`grow` and
:func:`split_total` hold a total exactly (Shewchuk's partials) for the accumulator
(:mod:`.fold`). :func:`prepare` reads files once for several merges (the accumulator's,
which change only at a fold).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.samples import Sample


def grow(partials: Sequence[float], value: float) -> list[float]:
    """Shewchuk's exact addition: ``partials`` (non-overlapping doubles whose exact sum
    is a running total) plus ``value``, exactly (the algorithm of ``math.fsum``;
    Shewchuk, "Adaptive Precision Floating-Point Arithmetic", 1997). A non-finite value
    or partial leaves one plain float sum."""
    if not math.isfinite(value) or not all(math.isfinite(p) for p in partials):
        return [sum(partials, value)]
    out: list[float] = []
    x = value
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            out.append(lo)
        x = hi
    out.append(x)
    return out


def exact_sum(values: Iterable[float]) -> float:
    """The correctly rounded sum (``math.fsum``), or the plain sum when infinities or
    NaN make ``fsum`` refuse."""
    values = list(values)
    try:
        return math.fsum(values)
    except (OverflowError, ValueError):  # inf - inf, or an intermediate overflow
        return sum(values)


def split_total(partials: Sequence[float]) -> list[float]:
    """``[total, remainder...]``: the correctly rounded total, then the non-overlapping
    doubles whose exact sum is what the total leaves out (empty for exact totals)."""
    total = exact_sum(partials)
    if not math.isfinite(total):
        return [total]
    rest: list[float] = []
    for p in [*partials, -total]:
        rest = grow(rest, p)
    return [total, *sorted((r for r in rest if r), key=abs, reverse=True)]


def _sums(metric: Metric) -> bool:
    mode = getattr(metric, "_multiprocess_mode", "")
    return metric.type != "gauge" or mode in ("sum", "livesum")


def _series(sample: Sample, gauge: bool) -> tuple[object, ...]:
    """One series of a family: sample name and labels (a gauge's ``pid`` label aside)."""
    labels = tuple(x for x in sample.labels if x[0] != "pid") if gauge else sample.labels
    return (sample.name, labels)


@dataclasses.dataclass(frozen=True)
class Folded:
    """Files read once, ready to merge with others (:func:`prepare`; the accumulator's,
    which change only at a fold).

    Attributes:
        families: metric name -> the family as prometheus-client reads it (samples: one
            per file and series).
        sums: for the families whose series add up: one sample per series (value: its exact
            total), the series' index in that list, and every value read for it.
    """

    families: dict[str, Metric]
    sums: dict[str, tuple[list[Sample], dict[tuple[object, ...], int], list[tuple[float, ...]]]]


def prepare(files: Sequence[str]) -> Folded:
    """Read ``files`` for :func:`merge`'s ``extra``.

    Raises:
        OSError, RuntimeError, ValueError: a file cannot be read.
    """
    families = dict(MultiProcessCollector._read_metrics(files))
    sums = {}
    for name, family in families.items():
        if not _sums(family):
            continue
        gauge = family.type == "gauge"
        index: dict[tuple[object, ...], int] = {}
        kept: list[Sample] = []
        values: list[list[float]] = []
        for sample in family.samples:
            at = index.setdefault(_series(sample, gauge), len(kept))
            if at == len(kept):
                kept.append(sample)
                values.append([])
            values[at].append(sample.value)
        totals = [
            s._replace(value=exact_sum(v)) if len(v) > 1 else s
            for s, v in zip(kept, values, strict=True)
        ]
        sums[name] = (totals, index, [tuple(v) for v in values])
    return Folded(families, sums)


def merge(files: Sequence[str], *, accumulate: bool, extra: Folded | None = None) -> list[Metric]:
    """``MultiProcessCollector.merge(files, accumulate)`` with exact sums.

    The library reads the files and accumulates; before it does, the samples of one
    series that it would add up one by one (counters, histogram buckets and sums,
    ``sum`` gauges) are replaced by their ``math.fsum``, so the result does not depend
    on the order of the files nor on how an accumulator split a total. ``extra``: files
    read before (:func:`prepare`), merged as if they were among ``files`` (and left
    unchanged): a render reads only the running processes' files again.

    Raises:
        OSError, RuntimeError, ValueError: a file cannot be read (half-written, or
            removed while read), as ``MultiProcessCollector.merge`` raises them.
    """
    metrics = MultiProcessCollector._read_metrics(files)
    known = extra or Folded({}, {})
    for name, family in known.families.items():
        if name not in metrics:
            metrics[name] = copy.copy(family)
            metrics[name].samples = []
    for name, metric in metrics.items():
        if not _sums(metric):
            if name in known.families:
                metric.samples = [*metric.samples, *known.families[name].samples]
            continue
        gauge = metric.type == "gauge"
        totals, where, read_values = known.sums.get(name, ([], {}, []))
        kept, index, base = list(totals), dict(where), len(totals)
        several: dict[int, list[float]] = {}  # series written by more than one file
        for sample in metric.samples:
            key = _series(sample, gauge)
            at = index.get(key)
            if at is None:
                index[key] = len(kept)
                kept.append(sample)
                continue
            values = several.get(at)
            if values is None:
                values = several[at] = list(read_values[at]) if at < base else [kept[at].value]
            values.append(sample.value)
        for at, values in several.items():
            kept[at] = kept[at]._replace(value=exact_sum(values))
        metric.samples = kept
    return list(MultiProcessCollector._accumulate_metrics(metrics, accumulate))


def key_job(key: str) -> str | None:
    """The ``job`` label of a multiprocess key (``mmap_key``'s JSON), None without one."""
    try:
        labels = json.loads(key)[2]
    except (ValueError, IndexError, TypeError):
        return None
    job = labels.get("job") if isinstance(labels, dict) else None
    return job if isinstance(job, str) else None


def file_jobs(path: Path) -> frozenset[str]:
    """The ``job`` labels of the series in one multiprocess file.

    Raises:
        OSError, RuntimeError: the file cannot be read (as the library's reader raises).
    """
    values = MmapedDict.read_all_values_from_file(str(path))
    return frozenset(job for key, *_ in values if (job := key_job(key)) is not None)


__all__ = [
    "Folded",
    "exact_sum",
    "file_jobs",
    "grow",
    "key_job",
    "merge",
    "prepare",
    "split_total",
]
