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

from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as openmetrics

_EOF = b"# EOF\n"


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
    """A counter whose samples are named like the family (no ``_total``)."""
    return family.type == "counter" and all(s.name == family.name for s in family.samples)


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
    if not _bare_counter(family):
        return generate_latest(_Families([family]))
    text = generate_latest(_Families([_as_unknown(family)]))
    untyped = f"# TYPE {family.name} untyped\n".encode()
    return text.replace(untyped, f"# TYPE {family.name} counter\n".encode(), 1)


def render_openmetrics(family: Metric) -> bytes:
    """One family in OpenMetrics 1.0 without the closing ``# EOF`` (a DCGM counter as unknown)."""
    view = _as_unknown(family) if _bare_counter(family) else family
    text = openmetrics.generate_latest(_Families([view]))
    return text.removesuffix(_EOF)


def render(families: Iterable[Metric], *, openmetrics_format: bool = False) -> bytes:
    """Families in one format, without ``# EOF`` (see :func:`close`)."""
    encode = render_openmetrics if openmetrics_format else render_text
    return b"".join(encode(family) for family in families)


def close(body: bytes, *, openmetrics_format: bool) -> bytes:
    """The whole exposition: OpenMetrics ends with ``# EOF``; the text format does not."""
    return body + _EOF if openmetrics_format else body


__all__ = ["DcgmFamily", "close", "render", "render_openmetrics", "render_text"]
