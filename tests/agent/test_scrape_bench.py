"""benchmarks/scrape_bench.py runs end to end (--quick) and prints its ratios; no figure is judged."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "scrape_bench.py"


def test_quick_benchmark_prints_the_render_ratio_after_restarts_with_the_noise_floor(
    tmp_path: Path,
) -> None:
    figures = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for row in (
        "render CPU after 50 restarts, folded / fresh node",
        "render CPU after 50 restarts, unfolded (before the fold) / fresh",
        "noise floor (A/A): render CPU, fresh again / fresh",
        "rank-health counter read CPU after 50 restarts, folded / fresh",
        "target: render after 50 restarts within 1.5x of a fresh node (CPU time): ratio ",
        "machine: ",
    ):
        assert row in done.stdout, row
    result = json.loads(figures.read_text())
    ratios = [
        r for kind in ("render", "counters") for v in result[f"{kind}_ratio"].values() for r in v
    ]
    assert ratios and all(math.isfinite(r) and r > 0 for r in ratios)
    files = result["files"]
    # The fold is what the benchmark measures: the restarted folder holds the running
    # ranks' files and the accumulator's, the unfolded one every restart's.
    assert files["restarted"] <= files["fresh"] + 4 < files["unfolded"]
