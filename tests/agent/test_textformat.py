"""Families are encoded byte for byte as prometheus-client encodes them, also when each
series' labels are kept from the last render (:class:`SampleLines`, issue 20)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar, Sample

from stormwatch.agent import textformat
from stormwatch.agent.textformat import DcgmFamily, SampleLines, render_openmetrics, render_text


def _gauge(value: float) -> Metric:
    family = GaugeMetricFamily("stormwatch_gpu_up", "GPU up.", labels=["gpu", "note"])
    family.add_metric(["0", 'quote " back \\ line\n end'], value)
    family.add_metric(["1", "ünïcode"], value + 1)
    family.add_metric(["2", ""], value)
    return family


def _counter(value: float) -> Metric:
    family = CounterMetricFamily("stormwatch_errors", "Errors.\nSecond line \\.", labels=["gpu"])
    family.add_metric(["0"], value)
    return family


def _counter_created(value: float) -> Metric:
    family = CounterMetricFamily("stormwatch_errors", "Errors.", labels=["gpu"])
    family.add_metric(["0"], value, created=1700000000.5)
    return family


def _counter_exemplar(value: float) -> Metric:
    family = CounterMetricFamily("stormwatch_errors", "Errors.", labels=["gpu"])
    family.add_sample("stormwatch_errors_total", {"gpu": "0"}, value, None, Exemplar({"t": "1"}, 1))
    return family


def _timestamped(value: float) -> Metric:
    family = GaugeMetricFamily("stormwatch_temp", "Temp.", labels=["gpu"])
    family.add_metric(["0"], value, timestamp=1700000000.25)
    return family


def _dcgm_counter(value: float) -> Metric:
    family = DcgmFamily("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Energy (mJ).", "counter", ["gpu"])
    family.add_metric(["0"], value, {"pod": "p"})
    family.add_metric(["1"], value)
    return family


def _empty_counter(value: float) -> Metric:
    return CounterMetricFamily("stormwatch_errors", "Errors.", labels=["gpu"])


def _histogram(value: float) -> Metric:
    family = HistogramMetricFamily("stormwatch_wait_seconds", "Wait.", labels=["rank"])
    family.add_metric(["0"], [("0.5", 1.0), ("+Inf", value)], sum_value=value * 0.5)
    return family


def _unit(value: float) -> Metric:
    family = GaugeMetricFamily("stormwatch_clock", "Clock.", labels=[], unit="hertz")
    family.add_metric([], value)
    return family


def _info(value: float) -> Metric:
    family = InfoMetricFamily("stormwatch_build", "Build.", labels=["node"])
    family.add_metric(["n"], {"version": str(value)})
    return family


def _no_value(value: float) -> Metric:
    family = Metric("stormwatch_odd", "Odd.", "unknown")
    family.samples.append(Sample("stormwatch_odd", {}, None))  # type: ignore[arg-type]
    return family


BUILDERS: list[Callable[[float], Metric]] = [
    _gauge,
    _counter,
    _counter_created,
    _counter_exemplar,
    _timestamped,
    _dcgm_counter,
    _empty_counter,
    _histogram,
    _unit,
    _info,
]
VALUES = [0.0, 1.0, -2.5, 1e21, 123456789.0, 7, True, math.inf, -math.inf, math.nan, 0.1]


@pytest.mark.parametrize("openmetrics_format", [False, True])
@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
def test_kept_labels_render_the_bytes_prometheus_client_renders(
    build: Callable[[float], Metric], openmetrics_format: bool
) -> None:
    library = render_openmetrics if openmetrics_format else render_text
    lines = SampleLines(openmetrics_format=openmetrics_format)
    for value in VALUES * 2:  # the second pass is served from kept prefixes
        family = build(value)
        assert lines.render(family) == library(family)


def test_a_sample_without_a_value_fails_in_openmetrics_as_in_the_library() -> None:
    lines = SampleLines(openmetrics_format=True)
    assert lines.render(_no_value(0.0)) == render_openmetrics(_no_value(0.0))
    with pytest.raises(TypeError):
        SampleLines(openmetrics_format=False).render(_no_value(0.0))


def test_a_bad_label_value_fails_as_in_the_library() -> None:
    family = GaugeMetricFamily("stormwatch_gpu_up", "GPU up.", labels=["gpu"])
    family.add_sample("stormwatch_gpu_up", {"gpu": 0}, 1.0)  # type: ignore[dict-item]
    with pytest.raises(AttributeError):
        render_text(family)
    with pytest.raises(AttributeError):
        SampleLines(openmetrics_format=False).render(family)


def test_a_family_whose_values_moved_is_encoded_without_the_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = SampleLines(openmetrics_format=False)
    first = lines.render(_gauge(1.0))
    calls: list[str] = []
    real = textformat.generate_latest

    def counting(registry: object) -> bytes:
        calls.append("encode")
        return real(registry)  # type: ignore[arg-type]

    monkeypatch.setattr(textformat, "generate_latest", counting)
    second = lines.render(_gauge(2.0))
    assert calls == []
    assert second != first and second == render_text(_gauge(2.0))


def test_kept_prefixes_are_bounded() -> None:
    lines = SampleLines(openmetrics_format=False, limit=2)
    for gpu in range(5):
        family = GaugeMetricFamily("stormwatch_gpu_up", "GPU up.", labels=["gpu"])
        family.add_metric([str(gpu)], 1.0)
        assert lines.render(family) == render_text(family)
    assert len(lines._prefixes) <= 2


def test_an_empty_counter_keeps_the_librarys_total_lines_and_a_dcgm_one_its_own_name() -> None:
    empty = render_text(_empty_counter(0.0)).decode()
    assert "# TYPE stormwatch_errors_total counter\n" in empty  # as once it has samples
    assert "stormwatch_errors_total" in render_text(_counter(1.0)).decode()
    dcgm = DcgmFamily("DCGM_FI_DEV_XID_ERRORS", "XID.", "counter", ["gpu"])
    assert "# TYPE DCGM_FI_DEV_XID_ERRORS counter\n" in render_text(dcgm).decode()


def test_a_sample_line_of_another_shape_is_left_to_the_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Were the library's line for a sample ever not "name{labels} value", nothing is kept.
    monkeypatch.setattr(textformat, "_ZERO", " 0 # another shape\n")
    lines = SampleLines(openmetrics_format=False)
    for value in (1.0, 2.0):
        assert lines.render(_gauge(value)) == render_text(_gauge(value))
    assert lines._prefixes == {}
