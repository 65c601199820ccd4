"""The runner annotates Grafana: experiment start/end and each fault injected and reverted.

Stand-in rank processes (no lab), the controller-side ``freeze_rank`` fault, and the
stand-in Grafana of tests/conftest.py (``grafana``) or one that never answers
(``silent_grafana``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from stormwatch.chaos import (
    AttachedJobs,
    Runner,
    RunnerConfig,
    Target,
    ledger_path,
    parse_experiment,
)
from stormwatch.dashboards import AnnotationSettings, Annotator

TOKEN = "glsa_test-token"  # the stand-in's (tests/conftest.py GRAFANA_TEST_TOKEN)


def _experiment(job: str) -> str:
    return f"""
version: 1
title: freeze and annotate
job: {{name: {job}, steps: 1000000, checkpoint_every: 10}}
steady_state_hypothesis:
  title: the rank steps
  probes:
    - name: rank-progressing
      provider: {{type: job, expect: progressing, window_seconds: 1}}
      timeout_seconds: 10
method:
  - type: action
    name: freeze
    fault: {{kind: freeze_rank, rank: 0, ttl_seconds: 3600}}
  - {{type: pause, name: hold, seconds: 0.5}}
rollbacks:
  - {{type: revert, name: undo}}
rollback_strategy: always
"""


def _runner(tmp_path: Path, job: str, annotator: Annotator) -> Runner:
    run_dir = tmp_path / "run"
    target = Target(run_dir=run_dir, jobs=AttachedJobs(run_dir, world_size=1), world_size=1)
    return Runner(
        parse_experiment(_experiment(job)),
        source=Path("inline.yaml"),
        target=target,
        config=RunnerConfig(attach_job=job),
        annotator=annotator,
    )


def test_inject_and_revert_are_annotated(
    tmp_path: Path,
    grafana: Any,
    start_workload: Any,
    unique_job: Any,
    find_reapers: Any,
    wait_until: Any,
) -> None:
    job = unique_job("annotate")
    start_workload(job)
    annotator = Annotator(AnnotationSettings(url=grafana.url, token=TOKEN))
    runner = _runner(tmp_path, job, annotator)

    result = asyncio.run(runner.run())

    # The rank stays frozen until the rollback, so the "after" hypothesis fails.
    assert result.journal.status == "deviated" and result.journal.rollbacks_ok
    [fault] = result.journal.faults
    assert (annotator.sent, annotator.failed, annotator.dropped) == (4, 0, 0)
    tags = [a["tags"] for a in grafana.annotations]
    assert [t[-1] for t in tags] == [
        "experiment-started",
        "freeze_rank",
        "fault-reverted",
        "experiment-ended",
    ]
    assert all(t[:3] == ["stormwatch", "chaos", f"experiment:{runner.experiment_id}"] for t in tags)
    [injected] = grafana.texts("fault-injected")
    [reverted] = grafana.texts("fault-reverted")
    assert fault.id in injected and "freeze_rank on rank 0" in injected
    assert fault.id in reverted and "rollback undo" in reverted
    [start, inject, revert, end] = grafana.annotations
    assert start["time"] <= inject["time"] <= revert["time"] <= end["timeEnd"]
    assert end["time"] == int(result.journal.started_at * 1000)
    wait_until(lambda: not find_reapers(ledger_path(tmp_path / "run")), 10, "the reaper to exit")


def test_silent_grafana_delays_the_experiment_at_most_the_timeout(
    tmp_path: Path,
    silent_grafana: str,
    start_workload: Any,
    unique_job: Any,
    find_reapers: Any,
    wait_until: Any,
) -> None:
    job = unique_job("annotate-silent")
    start_workload(job)
    annotator = Annotator(AnnotationSettings(url=silent_grafana, token=TOKEN, timeout=1.0))
    runner = _runner(tmp_path, job, annotator)

    result = asyncio.run(runner.run())
    returned = time.time()

    # The rank stays frozen until the rollback, so the "after" hypothesis fails.
    assert result.journal.status == "deviated" and result.journal.rollbacks_ok
    assert result.journal.faults[0].state == "reverted"
    assert result.journal.ended_at is not None
    assert returned - result.journal.ended_at < 1.0 + 0.5
    assert annotator.sent == 0 and annotator.failed + annotator.dropped >= 3
    wait_until(lambda: not find_reapers(ledger_path(tmp_path / "run")), 10, "the reaper to exit")
