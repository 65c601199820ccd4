"""Rendering families in the two formats a scraper may ask for, with dcgm-exporter's counters.

Both encoders are prometheus-client's (``generate_latest`` for the text format
0.0.4, ``openmetrics.exposition.generate_latest`` for OpenMetrics 1.0); this
module only adapts one kind of family they do not know: a *DCGM counter*,
typed ``counter`` but named without ``_total`` (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``),
as dcgm-exporter exposes it. prometheus-client would write its ``# TYPE`` line
for ``<name>_total``, leaving the samples untyped; and OpenMetrics forbids a
counter sample without ``_total`` (prometheus-client's own parser rejects it).
So, like dcgm-exporter, the text format types it ``counter`` under its own name,
and OpenMetrics exposes it ``unknown`` (same name, same samples).

A DCGM family is built by :class:`DcgmFamily`: dcgm-exporter's label set varies
per series (``GPU_I_PROFILE``/``GPU_I_ID`` only on MIG instances, ``namespace``,
``pod``, ``container`` only on a GPU a pod holds), so its ``add_metric`` takes the
catalogue's labels plus optional extra ones.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeAlias

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_EOF = b"# EOF\n"
#: :class:`SampleLines`' key of one series' line prefix.
_PrefixKey: TypeAlias = tuple[bool, str, str, tuple[str, ...], tuple[str, ...]]


class DcgmFamily(Metric):
    """A family with dcgm-exporter's naming: samples carry the family's name as is.

    Args:
        name, documentation: family name and HELP text.
        typ: ``gauge``, ``counter`` (rendered without ``_total``) or ``unknown``.
        labels: label names of every series, in :meth:`add_metric`'s value order.
    """

    def __init__(self, name: str, documentation: str, typ: str, labels: Sequence[str]) -> None:
        super().__init__(name, documentation, typ)
        self._labelnames = tuple(labels)

    def add_metric(
        self, values: Sequence[str], value: float, extra: Mapping[str, str] | None = None
    ) -> None:
        """One series: ``values`` for the family's labels, ``extra`` labels on top."""
        labels = dict(zip(self._labelnames, values, strict=True))
        if extra:
            labels.update(extra)
        self.add_sample(self.name, labels, float(value))

    def add_labelled(self, labels: dict[str, str], value: float) -> None:
        """One series whose whole label set is ``labels`` (kept as is, not copied: the
        caller shares one dict among the series' families and must not change it)."""
        self.add_sample(self.name, labels, float(value))


def _bare_counter(family: Metric) -> bool:
    """A counter whose samples are named like the family (no ``_total``): a
    :class:`DcgmFamily` counter, or one whose samples all are so named. An empty
    prometheus-client counter keeps the library's ``_total`` HELP and TYPE lines."""
    if family.type != "counter":
        return False
    if isinstance(family, DcgmFamily):
        return True
    return bool(family.samples) and all(s.name == family.name for s in family.samples)


def _as_unknown(family: Metric) -> Metric:
    clone = Metric(family.name, family.documentation, "unknown", family.unit)
    clone.samples = list(family.samples)
    return clone


class _Families:
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def render_text(family: Metric) -> bytes:
    """One family in the text format 0.0.4 (``generate_latest``), a DCGM counter typed counter."""
    return _text(family, _bare_counter(family))


def render_openmetrics(family: Metric) -> bytes:
    """One family in OpenMetrics 1.0 without the closing ``# EOF`` (a DCGM counter as unknown)."""
    return _openmetrics(family, _bare_counter(family))


def _text(family: Metric, bare: bool) -> bytes:
    if not bare:
        return generate_latest(_Families([family]))
    text = generate_latest(_Families([_as_unknown(family)]))
    untyped = f"# TYPE {family.name} untyped\n".encode()
    return text.replace(untyped, f"# TYPE {family.name} counter\n".encode(), 1)


def _openmetrics(family: Metric, bare: bool) -> bytes:
    view = _as_unknown(family) if bare else family
    return openmetrics.generate_latest(_Families([view])).removesuffix(_EOF)


def _with_samples(family: Metric, samples: list[Sample]) -> Metric:
    view = copy.copy(family)
    view.samples = samples
    return view


class SampleLines:
    """:func:`render_text` / :func:`render_openmetrics` of a family, with each series'
    line prefix (name and escaped, sorted labels) kept from one render to the next.

    prometheus-client escapes and sorts every label of every sample each time it
    encodes a family (~25 us a line, most of a render's CPU: on 8 GPUs x 18 NVLinks,
    ~600 lines a second whose value moved). Here the family's header and each series'
    ``name{labels} `` are encoded by prometheus-client itself, once, from the family
    with only that sample at value 0; a render then joins the kept prefix with
    ``floatToGoString(value)``, the library's own value encoding. A family with a
    sample the plain ``name{labels} value`` line does not describe (a timestamp, an
    exemplar, a native histogram, no value, or, in the text format, a ``_created`` /
    ``_gsum`` / ``_gcount`` sample the library moves to a family of its own) is
    encoded whole by the library, as before. The bytes are the same as the library's
    (``tests/agent/test_agent_frugality.py`` compares them).

    Args:
        openmetrics_format: OpenMetrics 1.0 (without ``# EOF``) or the text format 0.0.4.
        limit: series prefixes kept (then forgotten all at once and encoded again);
            65,536 is ~50 times the series of an 8-GPU node.

    Two threads may render with one instance at once: each step is one dict lookup or
    store, and a prefix lost to a concurrent ``clear`` is only encoded again.
    """

    def __init__(self, *, openmetrics_format: bool, limit: int = 65_536) -> None:
        self._openmetrics = openmetrics_format
        self._limit = limit
        self._headers: dict[tuple[str, str, str, str, bool], str] = {}
        # (bare, family, sample name, label names, label values): the names and the values
        # apart, not ``labels.items()``: the same key in 300 B instead of 570 B a series,
        # and made faster.
        self._prefixes: dict[_PrefixKey, str] = {}

    def render(self, family: Metric) -> bytes:
        """``family`` encoded, byte for byte what the library's encoder gives."""
        bare = _bare_counter(family)
        encode = _openmetrics if self._openmetrics else _text
        moved = () if self._openmetrics else _MOVED_SUFFIXES
        name = family.name
        lines = [self._header(family, bare)]
        for sample in family.samples:
            value = sample.value
            if (
                value is None
                or sample.timestamp is not None
                or sample.exemplar is not None
                or sample.native_histogram is not None
                or (moved and sample.name.startswith(name) and sample.name[len(name) :] in moved)
            ):
                return encode(family, bare)
            labels = sample.labels
            key = (bare, name, sample.name, tuple(labels), tuple(labels.values()))
            prefix = self._prefixes.get(key)
            if prefix is None:
                prefix = self._prefix(family, bare, sample, key)
                if prefix is None:  # a line of another shape: the library encodes it all
                    return encode(family, bare)
            lines.append(f"{prefix}{floatToGoString(value)}\n")
        return "".join(lines).encode()

    def _header(self, family: Metric, bare: bool) -> str:
        key = (family.name, family.type, family.documentation, family.unit, bare)
        header = self._headers.get(key)
        if header is None:
            encode = _openmetrics if self._openmetrics else _text
            header = encode(_with_samples(family, []), bare).decode()
            if len(self._headers) >= self._limit:
                self._headers.clear()
            self._headers[key] = header
        return header

    def _prefix(
        self,
        family: Metric,
        bare: bool,
        sample: Sample,
        key: _PrefixKey,
    ) -> str | None:
        """The kept ``name{labels} `` of ``sample``; ``None`` when the library's line for it
        is not that prefix followed by the value (then nothing is kept or guessed)."""
        encode = _openmetrics if self._openmetrics else _text
        alone = Sample(sample.name, sample.labels, 0.0)
        text = encode(_with_samples(family, [alone]), bare).decode()
        header = self._header(family, bare)
        if not text.startswith(header) or not text.endswith(_ZERO):
            return None
        line = text[len(header) :]
        if line.count("\n") != 1:
            return None
        prefix = line[: -len(_ZERO) + 1]
        if len(self._prefixes) >= self._limit:
            self._prefixes.clear()
        self._prefixes[key] = prefix
        return prefix


#: A value-0 sample line ends so (the prefix keeps its space).
_ZERO = " 0.0\n"
#: Text-format samples prometheus-client moves to a gauge family of their own.
_MOVED_SUFFIXES = ("_created", "_gsum", "_gcount")


def render(families: Iterable[Metric], *, openmetrics_format: bool = False) -> bytes:
    """Families in one format, without ``# EOF`` (see :func:`close`)."""
    encode = render_openmetrics if openmetrics_format else render_text
    return b"".join(encode(family) for family in families)


def close(body: bytes, *, openmetrics_format: bool) -> bytes:
    """The whole exposition: OpenMetrics ends with ``# EOF``; the text format does not."""
    return body + _EOF if openmetrics_format else body


__all__ = [
    "DcgmFamily",
    "SampleLines",
    "close",
    "render",
    "render_openmetrics",
    "render_text",
]
