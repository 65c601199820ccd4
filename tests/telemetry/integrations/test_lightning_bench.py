"""benchmarks/lightning_bench.py runs end to end (--quick) and prints its table; no figure
is judged (a speed target belongs to the benchmark, not to a test)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "lightning_bench.py"


@pytest.mark.timeout(300)
def test_quick_lightning_benchmark_prints_the_overhead_and_the_noise_floor(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for row in (
        "overhead: step wall time, stormwatch / bare",
        "overhead: step CPU time, stormwatch / bare",
        "noise floor (A/A): wall, bare again / bare",
        "overhead per step (pooled medians)",
        "machine: ",
    ):
        assert row in done.stdout, row
    result = json.loads(figures.read_text())
    ratios = [r for kind in ("wall", "cpu") for rs in result[f"{kind}_ratio"].values() for r in rs]
    assert len(ratios) == 4 and all(math.isfinite(r) and r > 0 for r in ratios)
    assert result["plan"]["reps"] == 1 and result["machine"]["torch"]
