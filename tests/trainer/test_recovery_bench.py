"""benchmarks/recovery_bench.py runs end to end (--quick) and prints its breakdown; no figure
is judged."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]


def test_quick_benchmark_prints_the_restart_breakdown_with_the_noise_floor(
    tmp_path: Path, quick_benchmark: Any
) -> None:
    _, result = quick_benchmark(
        "recovery_bench.py",
        tmp_path,
        (
            "old workers all exited",
            "new workers started",
            "  imports",
            "  checkpoint_load",
            "first step after the restart",
            "A/A: lab-again",
            "import of the training loop + exit, one process, CPU: ",
            "target kill -> first step <= 5 s: ",
            "machine: ",
        ),
        timeout=400,
    )
    trial = result["trials"]["lab"][0]
    ends = trial["ends"]
    # Every part of the new ranks' start-up ends after the kill, in order, before the step.
    order = [ends[part] for part in ("cli", "imports", "rendezvous", "parallelize")]
    assert trial["workers_started"] < order[0] and order == sorted(order)
    assert ends["checkpoint_load"] < trial["first_step"]
    assert all(math.isfinite(v) and v >= 0 for v in trial["cpu"].values())
    assert result["imports"]["cli"] > 0
