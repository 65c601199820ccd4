"""benchmarks/scrape_bench.py runs end to end (--quick) and prints its ratios; no figure is judged."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]


def test_quick_benchmark_prints_the_render_ratio_after_restarts_with_the_noise_floor(
    tmp_path: Path,
    quick_benchmark: Any,
) -> None:
    _, result = quick_benchmark(
        "scrape_bench.py",
        tmp_path,
        (
            "render CPU after 50 restarts, folded / fresh node",
            "render CPU after 50 restarts, unfolded (before the fold) / fresh",
            "noise floor (A/A): render CPU, fresh again / fresh",
            "rank-health counter read CPU after 50 restarts, folded / fresh",
            "target: render after 50 restarts within 1.5x of a fresh node (CPU time): ratio ",
            "machine: ",
        ),
        timeout=300,
    )
    ratios = [
        r for kind in ("render", "counters") for v in result[f"{kind}_ratio"].values() for r in v
    ]
    assert ratios and all(math.isfinite(r) and r > 0 for r in ratios)
    files = result["files"]
    # The fold is what the benchmark measures: the restarted folder holds the running
    # ranks' files and the accumulator's, the unfolded one every restart's.
    assert files["restarted"] <= files["fresh"] + 4 < files["unfolded"]
