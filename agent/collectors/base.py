"""Collector plumbing: catalogue-typed metric families and the failure-isolating set.

A collector is anything with a ``name`` and a ``collect()`` yielding fresh
prometheus-client metric families (client_python's custom-collector shape).
:class:`CollectorSet` is the one object registered in the agent's
``CollectorRegistry``: it runs each enabled collector on its own, so one that
raises (or yields something the exposition cannot render) costs only its own
metrics, and it appends ``stormwatch_collector_up`` / ``_errors_total`` /
``_duration_seconds``. ``/metrics`` therefore never fails as a whole.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, TypeAlias

from opentelemetry import trace
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.samples import Sample

from stormwatch.agent.catalogue import Catalogue, load_catalogue
from stormwatch.agent.textformat import DcgmFamily, SampleLines

log = logging.getLogger(__name__)


class Collector(Protocol):
    """A named prometheus-client custom collector."""

    name: str

    def collect(self) -> Iterable[Metric]: ...


Family: TypeAlias = GaugeMetricFamily | CounterMetricFamily | UnknownMetricFamily | DcgmFamily


def new_family(name: str, catalogue: Catalogue | None = None) -> Family:
    """An empty metric family typed, labelled and documented from the catalogue.

    Add samples with ``family.add_metric([label values in catalogue order], value)``.
    A dcgm-exporter name (``DCGM_*``) gets a :class:`DcgmFamily`: its counters keep
    dcgm-exporter's name without ``_total`` and its series may carry extra labels
    (MIG instance, pod), as dcgm-exporter's do.

    Raises:
        KeyError: ``name`` is not in the catalogue (so an uncatalogued metric
            cannot be exported by accident).
        ValueError: ``name`` is a histogram (:func:`new_histogram`).
    """
    spec = (catalogue or load_catalogue())[name]
    labels = list(spec.labels)
    if spec.name.startswith("DCGM_") and spec.type != "histogram":
        typ = {"untyped": "unknown"}.get(spec.type, spec.type)
        return DcgmFamily(spec.name, spec.help, typ, labels)
    if spec.type == "gauge":
        return GaugeMetricFamily(spec.name, spec.help, labels=labels)
    if spec.type == "counter":
        return CounterMetricFamily(spec.name, spec.help, labels=labels)
    if spec.type == "untyped":
        return UnknownMetricFamily(spec.name, spec.help, labels=labels)
    raise ValueError(f"{name}: a {spec.type}, made with new_histogram")


def new_histogram(name: str, catalogue: Catalogue | None = None) -> HistogramMetricFamily:
    """An empty histogram family, documented from the catalogue; add samples with
    ``family.add_metric(labels, buckets=[(le, cumulative count)...], sum_value=s)``.

    Raises:
        KeyError: ``name`` is not in the catalogue.
        ValueError: ``name`` is not a histogram there.
    """
    spec = (catalogue or load_catalogue())[name]
    if spec.type != "histogram":
        raise ValueError(f"{name}: a {spec.type}, made with new_family")
    return HistogramMetricFamily(spec.name, spec.help, labels=list(spec.labels))


class LabelSets:
    """Samples kept from one collect to the next, for collectors that export the same
    series every time (per-link NVLink counters: ~1,300 series on 8 GPUs x 18 links;
    the DCGM families of every GPU).

    The first time a series is added it goes through the family's own ``add_metric``;
    after that its sample name and label dict are reused, and so is the whole
    ``Sample`` while its value stays the same (most NVLink states, support flags and
    error counters, a GPU's identity-bound gauges): no dict, no tuple built per sample,
    and the render's comparison with the last samples stops at the sample's identity.
    A value of another type (``1`` after ``1.0``) makes a new sample, so the samples
    are always those ``add_metric`` would have made. Holds at most ``limit`` series,
    then starts again.
    """

    def __init__(self, limit: int = 65_536) -> None:
        self._kept: dict[tuple[str, tuple[str, ...]], Sample] = {}
        self._labelled: dict[tuple[str, int], tuple[dict[str, str], Sample]] = {}
        self._limit = limit

    def add(self, family: Family, values: tuple[str, ...], value: float) -> None:
        """``family.add_metric(list(values), value)``, with the labels of the last time."""
        key = (family.name, values)
        kept = self._kept.get(key)
        if kept is None:
            family.add_metric(list(values), value)
            if len(self._kept) >= self._limit:
                self._kept.clear()
            self._kept[key] = family.samples[-1]
            return
        if kept.value != value or type(kept.value) is not type(value):
            kept = self._kept[key] = Sample(kept.name, kept.labels, value)
        family.samples.append(kept)

    def add_labelled(self, family: DcgmFamily, labels: dict[str, str], value: float) -> None:
        """``family.add_labelled(labels, value)``, reusing the last sample while
        ``labels`` is the same dict (kept alive here, so its id is not reused) and the
        value is equal."""
        value = float(value)
        key = (family.name, id(labels))
        kept = self._labelled.get(key)
        if kept is None or kept[0] is not labels or kept[1].value != value:
            if len(self._labelled) >= self._limit:
                self._labelled.clear()
            family.add_labelled(labels, value)
            self._labelled[key] = (labels, family.samples[-1])
            return
        family.samples.append(kept[1])


class CollectorSet:
    """Runs collectors in isolation and reports their health.

    Args:
        collectors: collectors to run, in exposition order; names must be unique.
        tracer: records ``collector.failure`` when a collector goes down (with
            the exception) and ``collector.recovered`` when it comes back
            (default: no-op). Repeated failures are counted, not traced.

    ``collect()`` is safe to call from several threads (scrapes overlap).
    """

    def __init__(
        self, collectors: Sequence[Collector], *, tracer: trace.Tracer | None = None
    ) -> None:
        names = [c.name for c in collectors]
        if len(set(names)) != len(names):
            raise ValueError(f"collector names must be unique, got {names}")
        self._collectors = tuple(collectors)
        self._tracer = tracer or trace.NoOpTracer()
        self._lock = threading.Lock()
        self._errors: collections.Counter[str] = collections.Counter(dict.fromkeys(names, 0))
        self._up: dict[str, bool] = dict.fromkeys(names, True)
        self._duration: dict[str, float] = dict.fromkeys(names, 0.0)
        # Per (collector, OpenMetrics?): family (name, type, HELP, unit) -> its samples and
        # rendered text at the last render.
        self._texts: dict[
            tuple[str, bool], dict[tuple[str, str, str, str], tuple[list[Sample], bytes]]
        ] = {}
        # Per (collector or "(health)" for the health families, OpenMetrics?): series' line prefixes.
        self._lines: dict[tuple[str, bool], SampleLines] = {}
        #: Families encoded, and families whose last text was reused, since construction.
        self.rendered_families = 0
        self.reused_families = 0
        #: Collector name -> CPU seconds (of the rendering thread) its successful
        #: collections and renders took since construction: where a render's CPU goes
        #: (``benchmarks/agent_bench.py``'s profile).
        self.cpu_seconds: dict[str, float] = dict.fromkeys(names, 0.0)

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the collectors that run."""
        return tuple(c.name for c in self._collectors)

    def health(self) -> dict[str, bool]:
        """Collector name -> whether its last collection succeeded."""
        with self._lock:
            return dict(self._up)

    def collect(self) -> Iterator[Metric]:
        """Every collector's families, then the collector health families."""
        for collector in self._collectors:
            families, _ = self._run(collector)
            yield from families
        yield from self._health_families()

    def render(self, *, openmetrics_format: bool = False) -> bytes:
        """The exposition of every collector, then collector health: the text format
        0.0.4, or OpenMetrics without its closing ``# EOF`` (:mod:`..textformat`).

        What ``/metrics`` serves: each collector is rendered once, inside its
        guard, and the bytes are joined (the same text as ``generate_latest``
        of a registry holding this set, at half the cost).
        """
        parts = [self._run(c, openmetrics_format)[1] for c in self._collectors]
        encode = self._encoder(("(health)", openmetrics_format)).render
        parts.extend(encode(family) for family in self._health_families())
        return b"".join(parts)

    def _run(
        self, collector: Collector, openmetrics_format: bool = False
    ) -> tuple[list[Metric], bytes]:
        started = time.perf_counter()
        cpu_started = time.thread_time()
        try:
            families = list(collector.collect())
            # Render inside the guard: a family the exposition cannot encode (bad
            # label value type, NaN label...) fails here, not in the whole scrape.
            text = self._render(collector.name, families, openmetrics_format)
        except Exception as exc:
            with self._lock:
                was_up = self._up[collector.name]
                self._up[collector.name] = False
                self._errors[collector.name] += 1
                self._duration[collector.name] = time.perf_counter() - started
            if was_up:
                log.warning(
                    "collector %s failed; its metrics are missing", collector.name, exc_info=True
                )
                span = self._tracer.start_span(
                    "collector.failure", attributes={"stormwatch.collector": collector.name}
                )
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
                span.end()
            else:
                log.warning(
                    "collector %s still failing: %s: %s", collector.name, type(exc).__name__, exc
                )
            return [], b""
        with self._lock:
            recovered = not self._up[collector.name]
            self._up[collector.name] = True
            self._duration[collector.name] = time.perf_counter() - started
            self.cpu_seconds[collector.name] += time.thread_time() - cpu_started
        if recovered:
            log.warning("collector %s recovered", collector.name)
            self._tracer.start_span(
                "collector.recovered", attributes={"stormwatch.collector": collector.name}
            ).end()
        return families, text

    def _render(self, name: str, families: Sequence[Metric], openmetrics_format: bool) -> bytes:
        """``families`` in one format, one family at a time, reusing the text of a
        family whose samples are equal to those of the same family at the last render.

        Most GPU counters, identity and support flags, and every trainer series of an
        idle job, do not change from one render to the next. Rendering costs ~25 us a
        sample line (prometheus-client's ``generate_latest``); the reuse test is one
        list comparison of the samples (C-level, a pointer compare per unchanged
        ``Sample`` a collector hands back as is). A family is identified by name, type,
        HELP and unit; a change in any of them, or in the order of its samples, costs
        only a re-render. :attr:`rendered_families` and :attr:`reused_families` count
        the two outcomes (for the benchmark's account and tests). A family that changed
        is encoded by :class:`~stormwatch.agent.textformat.SampleLines`, which keeps each
        series' escaped labels from the last time.
        """
        slot = (name, openmetrics_format)
        previous = self._texts.get(slot, {})
        current: dict[tuple[str, str, str, str], tuple[list[Sample], bytes]] = {}
        encode = self._encoder(slot).render
        parts = []
        for family in families:
            key = (family.name, family.type, family.documentation, family.unit)
            last = previous.get(key)
            if last is not None and last[0] == family.samples:
                text = last[1]
                self.reused_families += 1
            else:
                text = encode(family)
                self.rendered_families += 1
            current[key] = (list(family.samples), text)
            parts.append(text)
        self._texts[slot] = current
        return b"".join(parts)

    def forget_format(self, openmetrics_format: bool) -> None:
        """Drop what renders of one format keep: each family's last text and samples, and
        the series' line prefixes. :class:`~stormwatch.agent.exposition.ExpositionCache`
        calls it, on its rendering thread, when no scraper asked for that format lately; a
        later render of it encodes every family again."""
        for kept in (self._texts, self._lines):
            for slot in [slot for slot in kept if slot[1] == openmetrics_format]:
                del kept[slot]

    def _encoder(self, slot: tuple[str, bool]) -> SampleLines:
        lines = self._lines.get(slot)
        if lines is None:
            lines = self._lines.setdefault(slot, SampleLines(openmetrics_format=slot[1]))
        return lines

    def _health_families(self) -> Iterator[Metric]:
        up = new_family("stormwatch_collector_up")
        errors = new_family("stormwatch_collector_errors_total")
        duration = new_family("stormwatch_collector_duration_seconds")
        with self._lock:
            for name in self.names:
                up.add_metric([name], 1.0 if self._up[name] else 0.0)
                errors.add_metric([name], float(self._errors[name]))
                duration.add_metric([name], self._duration[name])
        yield from (up, errors, duration)


__all__ = ["Collector", "CollectorSet", "LabelSets", "new_family", "new_histogram"]
