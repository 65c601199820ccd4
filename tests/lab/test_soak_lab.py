"""A short soak on the lab (issue 18): a fault-free elastic job with checkpoints, an
evaluation-like pause, a planned restart and an elastic resize; the soak counts what
Prometheus fired. Asserts no timings (``untimed``); ~2 min of soak plus the lab."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormwatch.chaos.gameday.soak import SoakPlan, count_alerts, run_soak, write_report
from stormwatch.chaos.gameday.soak_lab import lab_actions
from stormwatch.clients.prometheus import PrometheusClient
from stormwatch.lab import Lab
from stormwatch.telemetry.ranklogs import read_job_logs

pytestmark = [pytest.mark.e2e, pytest.mark.untimed, pytest.mark.root]


def test_a_short_fault_free_soak_counts_every_alert_and_fires_none(lab: Lab) -> None:
    plan = SoakPlan(
        minutes=2.0,
        job="soak-short",
        checkpoint_every=10,
        eval_every=40,
        eval_seconds=8.0,
        restart_at=0.3,
        resize_at=0.55,
        rejoin_after_seconds=25.0,
        settle_seconds=10.0,
    )
    url = lab.state.prometheus_url
    assert url is not None
    prometheus = PrometheusClient(url)
    report = run_soak(plan, lab_actions(lab, plan), prometheus)
    md, _ = write_report(report, Path(lab.run_dir) / "soaks" / plan.job)
    assert report.error is None, report.error
    assert [e.action for e in report.events] == ["start", "restart", "leave", "rejoin", "stop"]
    # The counting is what Prometheus has: the same query, counted again, agrees.
    assert report.alerts == count_alerts(prometheus, report.started_at, report.ended_at)
    # The job trained, resumed after the restart and paused in its eval phase.
    logs = read_job_logs(lab.paths.job_logs(plan.job))
    assert logs and max(log.last_step.step for log in logs.values() if log.last_step) > 40
    assert report.alerts == [], md.read_text()
