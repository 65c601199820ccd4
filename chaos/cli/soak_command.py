"""``stormwatch chaos soak``: a fault-free job on the lab for N minutes; every alert counted."""

from __future__ import annotations

import time
from pathlib import Path

import click

from stormwatch.chaos.cli.common import RUN_DIR, reap_overdue
from stormwatch.chaos.console import ConsoleReporter
from stormwatch.errors import StormwatchError

#: Exit status when an alert fired (or the soak failed).
EXIT_ALERTS = 1


@click.command()
@RUN_DIR
@click.option(
    "--minutes",
    type=click.FloatRange(0.1, 24 * 60),
    default=30.0,
    show_default=True,
    envvar="SOAK_MINUTES",
    help="Length of the soak ($SOAK_MINUTES).",
)
@click.option("--job", default=None, help="The job's name (default: soak-<time>).")
@click.option(
    "--eval-every",
    type=click.IntRange(0),
    default=200,
    show_default=True,
    help="Steps between evaluation-like pauses (0: none).",
)
@click.option(
    "--eval-seconds",
    type=click.FloatRange(0),
    default=15.0,
    show_default=True,
    help="Length of each evaluation-like pause.",
)
def soak(
    run_dir: Path, minutes: float, job: str | None, eval_every: int, eval_seconds: float
) -> int:
    """Train a fault-free elastic job on the lab in RUN_DIR for --minutes with checkpoints,
    evaluation-like pauses, a planned restart (at 40 %) and an elastic resize (node 1
    leaves at 70 % and rejoins a minute later), then count every alert that fired: the
    target is zero (docs/detection.md). The report is written to
    RUN_DIR/soaks/<job>/soak.md and soak.json.

    \b
      stormwatch chaos soak --run-dir run --minutes 30
      make soak SOAK_MINUTES=30

    Exit status: 0 when no alert fired; 1 otherwise (or when the soak failed); 2 when the
    lab is not up.
    """
    from stormwatch.chaos.gameday.soak import SoakPlan, run_soak, write_report
    from stormwatch.chaos.gameday.soak_lab import lab_actions
    from stormwatch.clients.prometheus import PrometheusClient
    from stormwatch.lab import Lab

    reap_overdue(run_dir)
    name = job or time.strftime("soak-%Y%m%dt%H%M%S", time.gmtime()).lower()
    plan = SoakPlan(minutes=minutes, job=name, eval_every=eval_every, eval_seconds=eval_seconds)
    lab = Lab(run_dir)
    try:
        url = lab.state.prometheus_url
        actions = lab_actions(lab, plan)
    except StormwatchError as exc:
        raise click.UsageError(f"{exc}; start the lab with `stormwatch lab up`") from exc
    if url is None:
        raise click.UsageError(f"the lab in {run_dir} has no Prometheus")
    reporter = ConsoleReporter()
    reporter.event(f"soak {name}: {minutes:g} min, no faults; every alert is counted")
    report = run_soak(
        plan,
        actions,
        PrometheusClient(url),
        on_event=lambda e: reporter.event(f"{e.action}: {e.detail}"),
    )
    md, _ = write_report(report, Path(run_dir) / "soaks" / name)
    reporter.stop()
    colour = "green" if report.ok else "red"
    reporter.console.print(
        f"[{colour}]{report.false_alarms} alert(s) fired[/]"
        + (f"; {report.error}" if report.error else ""),
        soft_wrap=True,
    )
    for alert in report.alerts:
        reporter.console.print(f"  {alert.alertname} {alert.labels}", soft_wrap=True)
    reporter.console.print(f"report: {md}", soft_wrap=True, highlight=False)
    return 0 if report.ok else EXIT_ALERTS


__all__ = ["soak"]
