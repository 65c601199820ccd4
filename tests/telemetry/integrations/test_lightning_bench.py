"""benchmarks/lightning_bench.py runs end to end (--quick) and prints its table; no figure
is judged (a speed target belongs to the benchmark, not to a test)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]


@pytest.mark.timeout(300)
def test_quick_lightning_benchmark_prints_the_overhead_and_the_noise_floor(
    tmp_path: Path, quick_benchmark: Any
) -> None:
    _, result = quick_benchmark(
        "lightning_bench.py",
        tmp_path,
        (
            "overhead: step wall time, stormwatch / bare",
            "overhead: training thread's CPU time, stormwatch / bare",
            "overhead: process CPU time (all threads), stormwatch / bare",
            "noise floor (A/A): wall, bare again / bare",
            "overhead per step (pooled medians)",
            "the callback's per-step hooks",
            "the per-step floor, timed directly on the training thread",
            "on a GPU machine (projected: the same",
            "where the API's cost remains on the training thread",
            "machine: ",
        ),
        timeout=280,
    )
    kinds = ("wall", "cpu", "thread")
    ratios = [r for kind in kinds for rs in result[f"{kind}_ratio"].values() for r in rs]
    assert len(ratios) == 6 and all(math.isfinite(r) and r > 0 for r in ratios)
    assert result["plan"]["reps"] == 1 and result["machine"]["torch"]
