"""``${since_start}``: a probe's window that sees nothing from before its run, on a real
Prometheus.

The default game day's experiment 14 deviated (2026-12-05, gd5): its probe
``absent_over_time(ALERTS{alertname="StormwatchAgentProcessDown"}[2m])`` saw the alert
experiment 12 had fired (and resolved) 98 s before, two experiments earlier.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from stormwatch.chaos import AttachedJobs
from stormwatch.chaos.execution.probes import ProbeContext, check, variables_now
from stormwatch.chaos.experiment.loader import parse_experiment
from stormwatch.chaos.experiment.providers import PrometheusProvider, Tolerance
from stormwatch.chaos.experiment.semantics import semantic_issues
from stormwatch.clients import AsyncPrometheusClient, PrometheusClient
from stormwatch.contracts.journal import JobRef

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="needs the prometheus binary (apt-get install prometheus)",
)


def _ctx(tmp_path: Path, url: str, started_at: float) -> ProbeContext:
    job = JobRef(name="j", log_dir=tmp_path / "logs", world_size=1, started_by_runner=False)
    return ProbeContext(
        job=job,
        jobs=AttachedJobs(tmp_path, world_size=1),
        prometheus=AsyncPrometheusClient(url),
        variables={"job": "j"},
        started_at=started_at,
    )


def test_an_alert_of_an_earlier_experiment_is_outside_the_since_start_window(
    tmp_path: Path, prometheus_with_rules: Any
) -> None:
    ends = time.time() + 12  # the "earlier experiment's" alert fires until then
    rule = {"alert": "Earlier", "expr": f"vector(time()) < {ends:.3f}"}
    with prometheus_with_rules(tmp_path / "prom", [rule]) as url:
        client = PrometheusClient(url)
        while not client.query('ALERTS{alertname="Earlier"}'):  # it did fire
            assert time.time() < ends, "Prometheus never evaluated the rule while it held"
            time.sleep(0.2)
        while time.time() < ends + 2.5:  # resolved, then this run starts
            time.sleep(0.2)
        started = time.time()
        time.sleep(2.0)
        fixed = PrometheusProvider(
            type="prometheus",
            query='absent_over_time(ALERTS{alertname="Earlier"}[2m])',
            tolerance=Tolerance(eq=1),
        )
        windowed = fixed.model_copy(
            update={"query": 'absent_over_time(ALERTS{alertname="Earlier"}[${since_start}])'}
        )
        ctx = _ctx(tmp_path, url, started)
        before = asyncio.run(check(fixed, ctx))
        after = asyncio.run(check(windowed, ctx))
    assert not before.ok and "no data" in before.detail, before
    assert after.ok, after
    assert isinstance(after.output, dict)
    assert re.search(r"\[[2-9]s\]|\[[1-9][0-9]s\]", str(after.output["query"])), after.output


def test_since_start_is_whole_seconds_rounded_up_and_at_least_one(tmp_path: Path) -> None:
    job = JobRef(name="j", log_dir=tmp_path, world_size=1, started_by_runner=False)
    base = {"job": job, "jobs": AttachedJobs(tmp_path, world_size=1), "prometheus": None}
    at = ProbeContext(**base, variables={"job": "j"}, started_at=100.0, clock=lambda: 194.2)
    assert variables_now(at) == {"job": "j", "since_start": "95s"}
    now = ProbeContext(**base, variables={}, started_at=100.0, clock=lambda: 100.0)
    assert variables_now(now)["since_start"] == "1s"


def test_an_experiment_file_may_use_since_start_in_a_range() -> None:
    text = """
version: 1
title: t
job: {name: j, world_size: 2, steps: 20, checkpoint_every: 10}
steady_state_hypothesis:
  title: no agent alert during this run
  probes:
    - name: agent-not-blamed
      provider:
        type: prometheus
        query: absent_over_time(ALERTS{alertname="StormwatchAgentProcessDown"}[${since_start}])
        tolerance: 1
method:
  - {type: pause, name: wait, seconds: 1}
"""
    experiment = parse_experiment(text, "x.yaml")
    # checked as PromQL with a duration standing in (a bare number is no range)
    assert semantic_issues(experiment) == []
    [probe] = experiment.steady_state_hypothesis.probes
    assert isinstance(probe.provider, PrometheusProvider)
    assert "[${since_start}]" in probe.provider.query
