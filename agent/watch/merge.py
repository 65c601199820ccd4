"""Exact sums and the exact merge of prometheus-client multiprocess files.

prometheus-client merges the files of a multiprocess folder by adding a series' values
one file at a time (``MultiProcessCollector._accumulate_metrics``), so a total depends on
the order of the files, and on how it is split among them, by a few ulps: enough for
Prometheus to take a counter for reset (any decrease is one). :func:`merge` is the
library's merge with each series' values summed by ``math.fsum`` first (correctly
rounded, order-free), reading and accumulating with the library itself; :func:`grow` and
:func:`split_total` hold a total exactly (Shewchuk's partials) for the accumulator
(:mod:`.fold`). :func:`prepare` reads files once for several merges (the accumulator's,
which change only at a fold). :class:`FileReader` reads files as the library does, parsing a
file again only when its bytes changed (a render reads every running process's files, and
most of them did not change since the last one).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import mmap
import os
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import _read_all_values, _unpack_integer
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.samples import Sample

from stormwatch.contracts.labels import TRAINING_JOB_LABEL


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


#: Parsed keys kept by a :class:`FileReader` before it starts its key cache again.
_KEY_CACHE_LIMIT = 100_000


class FileReader:
    """``MultiProcessCollector._read_metrics(files)``, parsing only the files whose bytes
    changed since this reader last read them.

    A file is read whole (one ``read`` of its used part, as
    ``MmapedDict.read_all_values_from_file`` reads it) and compared with the bytes of the
    last parse; only a changed file is parsed again (the library's ``_read_all_values``, its
    keys' JSON decoded once per reader, not once per call). The families returned are new
    objects on every call (callers replace their samples); their samples are shared.
    The result equals the library's: the same families, samples in the same order, a gauge
    family's ``_multiprocess_mode`` from the last file that holds it.

    Not thread-safe: the folder's owner calls it under its lock.
    """

    def __init__(self) -> None:
        #: path -> (the bytes parsed, the file's families)
        self._files: dict[str, tuple[tuple[bytes, int], dict[str, Metric]]] = {}
        self._keys: dict[str, tuple[str, str, tuple[tuple[str, str], ...], str]] = {}
        #: Advances whenever a file is parsed: a merge of the same files at the same
        #: generation has the same result.
        self.generation = 0
        #: (files, accumulate) -> (generation, the accumulator's files merged, the result):
        #: :func:`merge`'s last result per set of files.
        self.merged: dict[
            tuple[tuple[str, ...], bool], tuple[int, Folded | None, list[Metric]]
        ] = {}
        #: Files parsed so far (for tests and the benchmark's account).
        self.parsed = 0

    def read(self, files: Sequence[str]) -> dict[str, Metric]:
        """The families of ``files`` (metric name -> family; samples of every file).

        Raises:
            OSError, RuntimeError, ValueError: as the library's reader (a missing file that
                is not a ``live*`` gauge's, a corrupt one).
        """
        metrics: dict[str, Metric] = {}
        for path in files:
            for name, family in self._families(path).items():
                merged = metrics.get(name)
                if merged is None:
                    merged = metrics[name] = copy.copy(family)
                    merged.samples = list(family.samples)
                    continue
                merged.samples.extend(family.samples)
                if family.type == "gauge":
                    merged._multiprocess_mode = family._multiprocess_mode  # type: ignore[attr-defined]
        return metrics

    def retain(self, paths: Collection[str]) -> None:
        """Forget the files not in ``paths`` (those that are gone)."""
        for path in [p for p in self._files if p not in paths]:
            del self._files[path]
        for key in [k for k in self.merged if not set(k[0]) <= set(paths)]:
            del self.merged[key]

    def _families(self, path: str) -> dict[str, Metric]:
        parts = os.path.basename(path).split("_")
        try:
            data = _used_bytes(path)
        except FileNotFoundError:
            self._files.pop(path, None)
            if parts[0] == "gauge" and parts[1].startswith("live"):
                return {}  # removed by mark_process_dead since the listing, as the library
            raise
        cached = self._files.get(path)
        if cached is not None and cached[0] == data:
            return cached[1]
        families = self._parse(parts, data)
        self._files[path] = (data, families)
        self.parsed += 1
        self.generation += 1
        return families

    def _parse(self, parts: list[str], data: tuple[bytes, int]) -> dict[str, Metric]:
        """One file's families, built as ``MultiProcessCollector._read_metrics`` builds them."""
        if len(self._keys) > _KEY_CACHE_LIMIT:
            self._keys.clear()
        typ = parts[0]
        families: dict[str, Metric] = {}
        for key, value, timestamp, _ in _read_all_values(*data):
            parsed = self._keys.get(key)
            if parsed is None:
                metric_name, name, labels, help_text = json.loads(key)
                parsed = self._keys[key] = (
                    metric_name,
                    name,
                    tuple(sorted(labels.items())),
                    help_text,
                )
            metric_name, name, labels_key, help_text = parsed
            metric = families.get(metric_name)
            if metric is None:
                metric = families[metric_name] = Metric(metric_name, help_text, typ)
            if typ == "gauge":
                metric._multiprocess_mode = parts[1]  # type: ignore[attr-defined]
                pid = ("pid", parts[2][:-3])
                metric.add_sample(name, (*labels_key, pid), value, timestamp)  # type: ignore[arg-type]
            else:
                metric.add_sample(name, labels_key, value)  # type: ignore[arg-type]
        return families


#: A multiprocess file's header: how much of it is used (4 bytes), then 4 of padding.
_HEADER = 8


def _used_bytes(path: str) -> tuple[bytes, int]:
    """The used part of a multiprocess file and its length, read as
    ``MmapedDict.read_all_values_from_file`` reads it (the first 4 bytes say how much of the
    preallocated file is used). A file shorter than its header holds no values: its
    process was killed between creating it and prometheus-client sizing it (a rank
    SIGKILLed, or ended by SIGTERM's default action, as its first value of that type was
    written), which the library's reader would fail on."""
    with open(path, "rb") as infp:
        data = infp.read(mmap.PAGESIZE)
        if len(data) < _HEADER:
            return b"", _HEADER
        used = _unpack_integer(data, 0)[0]
        if used > len(data):
            data += infp.read(used - len(data))
    return data[:used], used


def file_values(path: str) -> list[tuple[str, float, float, int]]:
    """``MmapedDict.read_all_values_from_file(path)``, with a file shorter than its header
    read as empty (see :func:`_used_bytes`).

    Raises:
        OSError: the file cannot be read; RuntimeError: it is corrupt (as the library).
    """
    return list(_read_all_values(*_used_bytes(path)))


def merge(
    files: Sequence[str],
    *,
    accumulate: bool,
    extra: Folded | None = None,
    reader: FileReader | None = None,
) -> list[Metric]:
    """``MultiProcessCollector.merge(files, accumulate)`` with exact sums.

    The library reads the files and accumulates; before it does, the samples of one
    series that it would add up one by one (counters, histogram buckets and sums,
    ``sum`` gauges) are replaced by their ``math.fsum``, so the result does not depend
    on the order of the files nor on how an accumulator split a total. ``extra``: files
    read before (:func:`prepare`), merged as if they were among ``files`` (and left
    unchanged): a render reads only the running processes' files again. ``reader``: parses
    only the files that changed since its last read (:class:`FileReader`).

    Raises:
        OSError, RuntimeError, ValueError: a file cannot be read (half-written, or
            removed while read), as ``MultiProcessCollector.merge`` raises them.
    """
    if reader is None:
        return _merged(MultiProcessCollector._read_metrics(files), accumulate, extra)
    metrics = reader.read(files)
    memo_key = (tuple(files), accumulate)
    hit = reader.merged.get(memo_key)
    if hit is not None and hit[0] == reader.generation and hit[1] is extra:
        return [_fresh(family) for family in hit[2]]  # no file changed: the last result
    result = _merged(metrics, accumulate, extra)
    reader.merged[memo_key] = (reader.generation, extra, result)
    return [_fresh(family) for family in result]


def _fresh(family: Metric) -> Metric:
    """A copy of ``family`` whose samples a caller may replace."""
    copied = copy.copy(family)
    copied.samples = list(family.samples)
    return copied


def _merged(metrics: dict[str, Metric], accumulate: bool, extra: Folded | None) -> list[Metric]:
    """:func:`merge` of the families read."""
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
    """The ``training_job`` label of a multiprocess key (``mmap_key``'s JSON), None
    without one."""
    try:
        labels = json.loads(key)[2]
    except (ValueError, IndexError, TypeError):
        return None
    job = labels.get(TRAINING_JOB_LABEL) if isinstance(labels, dict) else None
    return job if isinstance(job, str) else None


def file_jobs(path: Path) -> frozenset[str]:
    """The ``training_job`` labels of the series in one multiprocess file.

    Raises:
        OSError, RuntimeError: the file cannot be read (as the library's reader raises).
    """
    values = file_values(str(path))
    return frozenset(job for key, *_ in values if (job := key_job(key)) is not None)


__all__ = [
    "FileReader",
    "Folded",
    "exact_sum",
    "file_jobs",
    "file_values",
    "grow",
    "key_job",
    "merge",
    "prepare",
    "split_total",
]
