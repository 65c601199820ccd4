"""``stormwatch chaos soak``: a fault-free job on the lab for T minutes, and every alert that fired."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from stormwatch.chaos.cli.common import RUN_DIR, reap_overdue
from stormwatch.chaos.console import ConsoleReporter
from stormwatch.chaos.execution.runner import EXIT_ABORTED, EXIT_OK
from stormwatch.chaos.soak.settings import SoakSettings
from stormwatch.words import plural


def _default(name: str) -> Any:
    """The settings' own default of field ``name`` (declared once, there)."""
    return SoakSettings.model_fields[name].default


@click.command()
@RUN_DIR
@click.option(
    "--minutes",
    type=click.FloatRange(0, 7 * 24 * 60, min_open=True),
    default=_default("minutes"),
    show_default=True,
    help="Length of the soak: the restart comes at 1/3, the resize at 2/3, the end at the end.",
)
@click.option(
    "--step-delay",
    type=click.FloatRange(0, 60),
    default=_default("step_delay"),
    show_default=True,
    help="Seconds the job sleeps after each step (the trainer's --step-delay).",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(1),
    default=_default("checkpoint_every"),
    show_default=True,
    help="Steps between checkpoints.",
)
@click.option(
    "--eval-every",
    type=click.IntRange(0),
    default=_default("eval_every"),
    show_default=True,
    help="Steps between evaluation pauses (0: none).",
)
@click.option(
    "--eval-seconds",
    type=click.FloatRange(0, 1800, min_open=True),
    default=_default("eval_seconds"),
    show_default=True,
    help="How long each evaluation pauses training (past the stall threshold, 5 s).",
)
@click.option(
    "--settle-seconds",
    type=click.FloatRange(0, 3600),
    default=_default("settle_seconds"),
    show_default=True,
    help="Seconds alerts are still counted after the job has been stopped.",
)
@click.option(
    "--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True, help="Job seed."
)
def soak(run_dir: Path, **values: Any) -> int:
    """Run one fault-free job on the lab in RUN_DIR for --minutes, with checkpoints,
    evaluation pauses, a planned restart and an elastic resize, and count every alert that
    fired meanwhile (the target is zero).

    The job is elastic (it runs on the lab's job nodes, down to one). At 1/3 of the soak it
    is stopped as an operator or the scheduler would (SIGTERM to every process) and started
    again, resuming from its last checkpoint; at 2/3 its last node leaves (SIGTERM to that
    node's torchrun), the job shrinks, and the node later rejoins; at the end the job is
    stopped. --settle-seconds later every alert that fired from the start (all of them, not
    only the job's) is read from Prometheus, each with the soak event nearest to it.
    The report (Markdown and JSON) is in RUN_DIR/soaks/<soak-id>/.

    \b
      stormwatch chaos soak --run-dir run --minutes 30
      make soak SOAK_MINUTES=30

    Exit status: 0 when no alert fired and the soak did everything it plans; 1 when an
    alert fired (or a step of the plan did not happen: the report says which); 130 when
    interrupted; 2 for a bad option or a lab that is not up.
    """
    from stormwatch.chaos.soak.job import LabSoak
    from stormwatch.chaos.soak.runner import SoakRunner

    settings = SoakSettings(**values)  # ConfigError (exit 2) before anything starts
    reap_overdue(run_dir)
    lab = LabSoak(run_dir)  # LabNotReady (exit 2): no lab, or not up
    reporter = ConsoleReporter()
    runner = SoakRunner(settings, lab, reporter=reporter)
    reporter.event(
        f"soak {runner.soak_id}: job {runner.job} for {settings.minutes:g} min on the lab "
        f"in {run_dir}"
    )
    report = runner.run()
    md, _ = runner.save()
    reporter.stop()
    fired = len(report.fired)
    colour = "green" if report.verdict == "pass" else "red"
    problems = f"; {plural(len(report.problems), 'problem')}" if report.problems else ""
    reporter.console.print(
        f"[{colour}]soak {report.verdict}[/]: {fired} alert{'' if fired == 1 else 's'} fired "
        f"({len(report.pending_only)} pending only) in "
        f"{((report.ended_at or report.started_at) - report.started_at) / 60:.1f} min, world "
        f"sizes {report.world_sizes}{escape(problems)}; report: {md}",
        soft_wrap=True,
        highlight=False,
    )
    if report.interrupted:
        return EXIT_ABORTED
    return EXIT_OK if report.verdict == "pass" else 1


__all__ = ["soak"]
