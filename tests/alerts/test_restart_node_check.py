"""Restarts wait for the scheduler while a node of the job answers nothing.

The Slurm lab's node cut (tests/chaos/test_slurm_lab_scenarios.py) showed why: the hang
alert fires 6 s into the cut, the responder's ``restart_workers`` requeued the job while
node1 could not be reached, the job sat COMPLETING until Slurm set node1 DOWN (35 s), and
Slurm 22.05 then failed it at the start of its next run ("_step_get_gres_cnt ... node
offset invalid") instead of the NODE_FAIL requeue that moves it to the spare.

The query of :func:`unreachable_nodes` runs in real promtool against the shipped node
rules (ALERTS of StormwatchNodeDown, pending from the first failed scrape); the action's
decision runs against a Prometheus stand-in behind :class:`AsyncPrometheusAPI`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from stormwatch.alerts import run_rule_tests
from stormwatch.alerts.actions.remedial import (
    CheckpointNow,
    ExcludeNodeRestart,
    RestartWorkers,
    unreachable_nodes,
)
from stormwatch.alerts.rulefiles import rule_files
from stormwatch.clients.errors import PrometheusAPIError
from stormwatch.clients.prometheus import Alert, Sample, Series
from stormwatch.contracts.responder import IncidentRecord


@dataclass
class _Prometheus:
    """Answers every instant query with ``nodes`` (one sample per node) or raises."""

    nodes: list[str] = field(default_factory=list)
    fail: bool = False
    queries: list[str] = field(default_factory=list)

    async def query(self, expr: str, *, at: float | None = None) -> list[Sample]:
        self.queries.append(expr)
        if self.fail:
            raise PrometheusAPIError("Prometheus at http://127.0.0.1:1 unreachable")
        return [Sample({"node": n}, 1.0, 0.0) for n in self.nodes]

    async def query_range(
        self, expr: str, *, start: float, end: float, step: float
    ) -> list[Series]:
        raise AssertionError("not used")

    async def alerts(self) -> list[Alert]:
        raise AssertionError("not used")


class _Backend:
    """Records nothing: the precheck is judged before the backend is called."""


@pytest.fixture
def incident(kit: Any) -> Callable[..., IncidentRecord]:
    """A StormwatchTrainingHung incident with the given labels."""

    def make(at: float | None = None, **labels: str) -> IncidentRecord:
        """Started firing at Unix time ``at`` (default: a minute ago)."""
        started = time.time() - 60 if at is None else at
        return cast(IncidentRecord, kit.closed_incident("StormwatchTrainingHung", labels, started))

    return make


def _query(job: str) -> str:
    prometheus = _Prometheus()
    assert asyncio.run(unreachable_nodes(prometheus, job)) == []
    [expr] = prometheus.queries
    return expr


def test_the_query_finds_a_cut_off_node_of_the_job_from_its_first_failed_scrape(
    tmp_path: Path,
) -> None:
    # node1 stops answering at t=61 (scrapes time out: 1 s); its rank's series go stale.
    # Job "j" ran on node0 and node1, job "other" on node2 only.
    series = {
        'up{job="stormwatch-agent",node="node0",instance="10.0.0.1:9400"}': "1x200",
        'scrape_duration_seconds{job="stormwatch-agent",node="node0",instance="10.0.0.1:9400"}': "0.01x200",
        'up{job="stormwatch-agent",node="node1",instance="10.0.0.2:9400"}': "1x60 0x59 1x80",
        'scrape_duration_seconds{job="stormwatch-agent",node="node1",instance="10.0.0.2:9400"}': "0.01x60 1x59 0.01x80",
        'up{job="stormwatch-agent",node="node2",instance="10.0.0.3:9400"}': "1x200",
        'scrape_duration_seconds{job="stormwatch-agent",node="node2",instance="10.0.0.3:9400"}': "0.01x200",
        'stormwatch_rank_up{training_job="j",rank="0",node="node0"}': "1x200",
        'stormwatch_rank_up{training_job="j",rank="1",node="node1"}': "1x60 stale",
        'stormwatch_rank_up{training_job="other",rank="0",node="node2"}': "1x200",
    }
    node1 = [{"labels": '{node="node1"}', "value": 1}]
    cases = [
        ("60s", "j", []),  # every node answers
        ("62s", "j", node1),  # pending from the first failed scrape (t=61)
        ("100s", "j", node1),  # firing; the rank's series stale for 40 s
        ("100s", "other", []),  # not a node of that job
        ("125s", "j", []),  # node1 answers again
    ]
    document = {
        "rule_files": [str(p) for p in rule_files() if p.name == "nodes.yml"],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": [
                    {"expr": _query(job), "eval_time": at, "exp_samples": expected}
                    for at, job, expected in cases
                ],
            }
        ],
    }
    path = tmp_path / "unreachable_test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    run = run_rule_tests([path])
    assert run.returncode == 0, run.output


def test_the_query_quotes_the_job_name() -> None:
    assert 'training_job="a\\"b"' in _query('a"b')


@pytest.mark.parametrize("action", [RestartWorkers, ExcludeNodeRestart])
def test_a_restart_is_skipped_while_a_node_of_the_job_is_unreachable(
    action: type, incident: Callable[..., IncidentRecord]
) -> None:
    prometheus = _Prometheus(nodes=["node1"])
    reason = asyncio.run(
        action(_Backend(), prometheus).precheck(incident(training_job="j", node="node0"))
    )
    assert reason is not None
    assert "node(s) node1 of job j unreachable (StormwatchNodeDown)" in reason
    assert "scheduler" in reason


def test_a_restart_runs_when_every_node_answers_or_prometheus_cannot_tell(
    incident: Callable[..., IncidentRecord],
) -> None:
    hung = incident(training_job="j")
    for prometheus in (_Prometheus(), _Prometheus(fail=True), None):
        assert asyncio.run(RestartWorkers(_Backend(), prometheus).precheck(hung)) is None


def test_actions_that_stop_no_rank_are_not_held_back(
    incident: Callable[..., IncidentRecord],
) -> None:
    prometheus = _Prometheus(nodes=["node1"])
    hung = incident(training_job="j")
    assert asyncio.run(CheckpointNow(_Backend(), prometheus).precheck(hung)) is None
    assert prometheus.queries == []


def test_a_restart_for_a_hang_waits_for_its_evidence_after_the_alert_started(
    incident: Callable[..., IncidentRecord],
) -> None:
    """The agents ask the hung ranks for their flight recorders when they see the hang (up
    to 5 s); a restart before then (Slurm: SIGCONT, SIGTERM) changes what they show. The
    lab's FC-10 zero-code case: no culprit named, the stopped rank had run on."""
    action = RestartWorkers(_Backend(), _Prometheus(), evidence_wait=1.0)
    started = time.monotonic()
    fresh = incident(at=time.time(), training_job="j")
    assert asyncio.run(action.precheck(fresh)) is None
    assert 0.8 < time.monotonic() - started < 3.0
    started = time.monotonic()
    assert asyncio.run(action.precheck(incident(training_job="j"))) is None  # a minute ago
    assert time.monotonic() - started < 0.5
