"""benchmarks/agent_bench.py runs end to end (--quick) and prints its rows; no figure is judged.

Its scrapes ask as Prometheus does (OpenMetrics, gzip), so the agent's gzip and OpenMetrics
paths serve every scrape here; node-exporter's columns appear where it is installed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]


def test_quick_benchmark_prints_the_agents_rows_and_where_its_cpu_goes(
    tmp_path: Path, quick_benchmark: Any
) -> None:
    stdout, result = quick_benchmark(
        "agent_bench.py",
        tmp_path,
        (
            "as Prometheus asks: OpenMetrics, gzip",
            "CPU share of one core",
            "resident memory (VmRSS)",
            "scrape p50 (ms)",
            "where the agent's CPU goes",
            "thread: stormwatch-rank-watcher",
            "processes on the machine: ",
        ),
        timeout=300,
    )
    agent = result["agent"]
    assert result["scrape"] == "prometheus"
    assert math.isfinite(agent["cpu_share"]) and agent["cpu_share"] >= 0
    assert agent["series"] > 100 and agent["rss"] > 0  # the body was decompressed and read
    assert result["profile"]["renders"] >= 1, result["profile"]
    if result.get("node_exporter"):  # the RSS rows and their floors need node-exporter
        floors = result["rss_floors"]
        # The libraries' floor holds the exporter floor's two imports and more.
        assert 0 < floors["exporter"] < floors["libraries"], floors
        assert "floor: + the agent's" in stdout  # rich wraps the rest of the label
        assert "the agent's own code" in stdout
        assert "the RSS row on a GPU machine (projected, not measured)" in stdout
