"""Collective bandwidths follow nccl-tests' definitions; MFU and the peak table."""

from __future__ import annotations

import pytest

from stormwatch.errors import ConfigError
from stormwatch.telemetry.perf import (
    CPU_NOMINAL_PEAK_FLOPS,
    bandwidths,
    bus_factor,
    collective_size,
    flops_per_token,
    mfu,
    peak_flops,
)


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 4, 2 * 3 / 4),
        ("all_reduce", 2, 1.0),
        ("reduce_scatter", 4, 3 / 4),
        ("all_gather", 8, 7 / 8),
        ("all_to_all", 2, 1 / 2),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("barrier", 8, 0.0),
        ("all_reduce", 1, 0.0),  # a one-rank group moves nothing over a bus
    ],
)
def test_bus_factor_matches_nccl_tests(op, n, factor):
    assert bus_factor(op, n) == pytest.approx(factor)


def test_all_gather_size_is_the_gathered_output_and_others_the_input():
    assert collective_size("all_gather", 100, 4) == 400
    assert collective_size("reduce_scatter", 400, 4) == 400
    assert collective_size("all_reduce", 400, 4) == 400


def test_algbw_is_size_over_time_and_busbw_applies_the_factor():
    algbw, busbw = bandwidths("all_reduce", 1_000_000, 4, 0.5)
    assert algbw == 2_000_000
    assert busbw == pytest.approx(2_000_000 * 1.5)
    assert bandwidths("all_gather", 250, 4, 1.0) == (1000.0, 750.0)
    assert bandwidths("all_reduce", 10, 4, 0.0) == (0.0, 0.0)


def test_flops_per_token_is_six_n_plus_attention():
    assert flops_per_token(non_embedding_params=1000, n_layers=2, d_model=8, seq_len=4) == (
        6000 + 12 * 2 * 8 * 4
    )


def test_mfu_divides_achieved_model_flops_by_peak_per_device():
    # 1e3 FLOPs/token x 1e6 tokens/s over 2 devices = 5e8 FLOP/s each, of 1e9 peak
    assert mfu(flops_per_token=1000, tokens=1_000_000, seconds=1.0, devices=2, peak=1e9) == 0.5
    assert mfu(flops_per_token=1000, tokens=10, seconds=0.0, devices=1, peak=1e9) == 0.0


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H200", 989e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Some Future GPU", None),
    ],
)
def test_peak_flops_by_device_name(name, expected):
    assert peak_flops(name, on_gpu=True) == expected


def test_peak_flops_on_cpu_is_nominal_and_overridable():
    assert peak_flops("cpu", on_gpu=False) == CPU_NOMINAL_PEAK_FLOPS
    assert peak_flops("NVIDIA H200", on_gpu=True, override=1e15) == 1e15
    with pytest.raises(ConfigError, match="peak_flops"):
        peak_flops("cpu", on_gpu=False, override=-1.0)
