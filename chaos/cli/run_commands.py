"""``stormwatch chaos validate`` and ``stormwatch chaos run``: check experiment files, run one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from stormwatch.chaos.cli.common import RUN_DIR, TARGET, reap_overdue
from stormwatch.chaos.console import ConsoleReporter
from stormwatch.chaos.errors import InvalidExperiment
from stormwatch.chaos.execution.runner import EXIT_OK, Runner, RunnerConfig, run_experiment
from stormwatch.chaos.experiment.loader import load_experiment
from stormwatch.chaos.experiment.model import Experiment
from stormwatch.chaos.reports.verify import Verification, write_verification
from stormwatch.contracts.journal import Journal
from stormwatch.errors import ConfigError, StormwatchError
from stormwatch.words import plural


def _activities(count: int) -> str:
    return f"{count} method {'activity' if count == 1 else 'activities'}"


def _after_text(journal: Journal) -> str:
    """What the after-phase said, in words (``not checked (method failed)`` when it did not run)."""
    met = journal.steady_state_after.met
    if met is not None:
        return "held" if met else "did NOT hold"
    if journal.steady_state_before.met is False:
        return "not checked (the hypothesis did not hold before)"
    if journal.status == "aborted":
        return "not checked (aborted)"
    if journal.steady_state_before.met is None:
        return "not checked (the job did not start)"
    return "not checked (the method failed)"


def _before_text(journal: Journal) -> str:
    met = journal.steady_state_before.met
    if met is None:
        return "not checked (the job did not start)"
    return "held" if met else "did NOT hold"


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def validate(files: tuple[Path, ...]) -> None:
    """Check experiment FILES without running anything (exit 2 when one is invalid).

    A folder stands for its experiment files (``*.yaml``, ``*.yml``), as ``chaos suite``
    reads them.
    """
    from stormwatch.chaos.gameday.suite import suite_files

    problems: list[StormwatchError] = []
    found: list[Path] = []
    for given in files:
        try:
            found += suite_files(given) if given.is_dir() else [given]
        except ConfigError:
            problems.append(
                ConfigError(f"{given}: no *.yaml or *.yml file in this folder (not searched below)")
            )
    files = tuple(found)
    console = Console()
    for file in files:
        try:
            experiment = load_experiment(file)
        except InvalidExperiment as exc:
            problems.append(exc)
            continue
        console.print(
            f"[green]ok[/] {file}: {experiment.title!r} "
            f"({_activities(len(experiment.method))}, "
            f"{plural(len(experiment.rollbacks), 'rollback')})",
            soft_wrap=True,
        )
    if len(problems) == 1 and len(files) + len(problems) == 1:
        raise problems[0]
    if problems:
        raise ConfigError("\n".join(str(p) for p in problems))


@click.command()
@click.argument("experiment", type=click.Path(path_type=Path))
@RUN_DIR
@TARGET
@click.option(
    "--job",
    "job",
    metavar="NAME",
    help="Attach to this running job instead of starting the experiment's job "
    "[default: the target file's job.attach].",
)
@click.option(
    "--baseline-job",
    metavar="NAME",
    help="Fault-free job to compare the loss against in the post-mortem (its rank logs "
    "where the target keeps them: the lab's job folder, the target file's job.log_dir).",
)
@click.option(
    "--postmortem/--no-postmortem",
    default=True,
    show_default=True,
    help="Write postmortem.md/.json next to the journal.",
)
@click.option(
    "--wait-resolved",
    type=click.FloatRange(0, 3600),
    default=0.0,
    show_default=True,
    help="Seconds the post-mortem waits for the alert to be received and resolved.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate and print the plan, the fault targets resolved on the target (the lab "
    "when up, else the file's job shape; --target FILE: exit 2 when it cannot be resolved); "
    "run nothing.",
)
def run(
    experiment: Path,
    run_dir: Path,
    target_file: Path | None,
    job: str | None,
    baseline_job: str | None,
    postmortem: bool,
    wait_resolved: float,
    dry_run: bool,
) -> int:
    """Run EXPERIMENT against the lab in --run-dir, or the cluster of --target FILE.

    The file (and the target file) are validated first (exit 2, nothing started, when
    invalid), then the target is checked, the job started (or attached with --job or
    the target file's job.attach), and the experiment
    run; the journal goes to RUN_DIR/experiments/<id>/journal.json. Ctrl-C stops
    injecting, reverts the faults and still writes the journal.

    Exit status: 0 when the hypothesis held before and after and every rollback
    succeeded; 1 otherwise; 130 when interrupted; 2 for an invalid experiment or
    a lab that is not up.
    """
    from stormwatch.chaos.platform_target import resolve_target
    from stormwatch.chaos.reports.report import generate_postmortem
    from stormwatch.platforms.targets import load_target_file

    spec = load_experiment(experiment)
    if target_file is not None:
        load_target_file(target_file)  # invalid: exit 2 before anything is asked or started
    if dry_run:
        return _dry_run(spec, experiment, run_dir, target_file)
    reap_overdue(run_dir)
    target = resolve_target(run_dir, target_file)
    reporter = ConsoleReporter()
    runner = Runner(
        spec,
        source=experiment,
        target=target,
        config=RunnerConfig(attach_job=job or target.attach_job),
        reporter=reporter,
    )
    reporter.event(f"experiment {runner.experiment_id}: {spec.title}")
    result = run_experiment(runner)
    reporter.stop()
    journal = result.journal
    if postmortem and journal.job is not None:
        baseline = target.jobs.log_dir(baseline_job) if baseline_job else None
        pm, md = asyncio.run(
            generate_postmortem(
                runner.experiment_dir,
                target=target,
                baseline_log_dir=baseline,
                wait_resolved_seconds=wait_resolved,
                reporter=reporter,
            )
        )
        reporter.stop()
        reporter.console.print(f"post-mortem: {md}", soft_wrap=True, highlight=False)
        _print_verification(
            write_verification(
                runner.experiment_dir, journal, pm, target=target, baseline_log_dir=baseline
            ),
            reporter.console,
        )
    colour = "green" if result.exit_code == EXIT_OK else "red"
    reporter.console.print(
        f"[{colour}]{journal.status}[/]: hypothesis before: {_before_text(journal)}, "
        f"after: {_after_text(journal)}; rollbacks "
        f"{'ok' if journal.rollbacks_ok else 'FAILED'}."
        + (f" Why: {escape(journal.error)}." if journal.error and result.exit_code else ""),
        soft_wrap=True,
    )
    reporter.console.print(f"journal: {result.journal_path}", soft_wrap=True, highlight=False)
    return result.exit_code


def _dry_run(spec: Experiment, experiment: Path, run_dir: Path, target_file: Path | None) -> int:
    """Print the plan on the resolved target; exit 0, or raise (exit 2) when a run would
    refuse it or ``--target`` could not be resolved."""
    from stormwatch.chaos.experiment.dryrun import print_plan, refuse_unresolved, target_shape

    resolved = target_shape(run_dir, target_file)
    refused = print_plan(spec, experiment, Console(highlight=False, soft_wrap=True), resolved)
    if refused is not None:
        raise ConfigError(f"{experiment}: a run would refuse this plan: {refused}")
    refuse_unresolved(resolved, target_file)
    return EXIT_OK


def _print_verification(result: Verification, console: Console) -> None:
    """One line per check of :mod:`stormwatch.chaos.reports.verify` (ok / FAILED / not checked)."""
    for name, check in (
        ("loss", result.loss),
        ("checkpoint", result.checkpoint),
        ("faults cleared", result.faults_cleared),
    ):
        mark = {True: "[green]ok[/]", False: "[red]FAILED[/]", None: "[yellow]not checked[/]"}
        console.print(f"{name}: {mark[check.ok]}: {escape(check.detail)}", soft_wrap=True)


__all__ = ["run", "validate"]
