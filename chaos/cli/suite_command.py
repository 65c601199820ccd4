"""``stormwatch chaos suite``: a game day, every experiment of a folder, and its scorecard."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape

from stormwatch.chaos.cli.common import RUN_DIR, TARGET, reap_overdue
from stormwatch.chaos.console import ConsoleReporter
from stormwatch.chaos.execution.runner import EXIT_ABORTED, EXIT_OK
from stormwatch.chaos.gameday.scorecard import ScorecardRow
from stormwatch.errors import ConfigError
from stormwatch.words import plural

if TYPE_CHECKING:
    from stormwatch.chaos.gameday.suite import SuiteEntry


@click.command()
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
@RUN_DIR
@TARGET
@click.option(
    "--baseline/--no-baseline",
    default=True,
    show_default=True,
    help="Train a fault-free baseline per seed and compare every experiment's loss to it.",
)
@click.option(
    "--wait-detected",
    type=click.FloatRange(0, 3600),
    default=60.0,
    show_default=True,
    help="Seconds each post-mortem waits for an alert to fire after the experiment.",
)
@click.option(
    "--strict-targets",
    is_flag=True,
    help="Fail an experiment detected later than its fault class's target, by an alert "
    "that names the wrong culprit, or with a false alarm (as expect.strict_targets does "
    "for one file); without it these are reported in the scorecard only.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate every experiment and print its plan on the target (as `chaos run "
    "--dry-run`: --target FILE: exit 2 when it cannot be resolved); run nothing.",
)
def suite(
    folder: Path,
    run_dir: Path,
    target_file: Path | None,
    baseline: bool,
    wait_detected: float,
    strict_targets: bool,
    dry_run: bool,
) -> int:
    """Run every experiment in DIR on the lab (or --target FILE), one after another, and
    write a scorecard.

    All files are validated first (exit 2, nothing started, when one is invalid, or
    when the target file attaches to a running job: a suite needs job.submit).
    The scorecard (per fault: detected?, by which alert, time to detect against its
    class's target, culprit named, false alarms, time to recover, steps lost,
    loss/checkpoint/fault checks, verdict) is written as
    Markdown and JSON to RUN_DIR/suites/<suite-id>/ after every experiment.
    Ctrl-C rolls the running experiment back and skips the rest.

    \b
      stormwatch chaos suite experiments/suite --run-dir run
      make game-day

    Exit status: 0 when every experiment passed; 1 otherwise; 130 when interrupted;
    2 for an invalid experiment or a lab that is not up.
    """
    from stormwatch.chaos.gameday.suite import SuiteOptions, SuiteRunner, load_suite
    from stormwatch.chaos.platform_target import resolve_target

    entries = load_suite(folder)
    if target_file is not None:  # invalid: exit 2 before anything is asked or started
        _check_target(target_file)
    if dry_run:
        return _dry_run(entries, folder, run_dir, target_file)
    reap_overdue(run_dir)
    target = resolve_target(run_dir, target_file)
    reporter = ConsoleReporter()
    runner = SuiteRunner(
        entries,
        folder=folder,
        target=target,
        options=SuiteOptions(
            baseline=baseline,
            wait_detected_seconds=wait_detected,
            strict_targets=strict_targets,
        ),
        reporter=reporter,
        on_row=functools.partial(_show_row, reporter),
    )
    reporter.event(f"suite {runner.suite_id}: {plural(len(entries), 'experiment')} in {folder}")
    card = runner.run()
    md, _ = runner.save()
    reporter.stop()
    colour = "green" if card.ok else "red"
    reporter.console.print(
        f"[{colour}]{card.passed}/{len(card.rows)} passed[/]"
        + (" (interrupted)" if card.interrupted else ""),
        soft_wrap=True,
    )
    reporter.console.print(f"scorecard: {md}", soft_wrap=True, highlight=False)
    if card.interrupted:
        return EXIT_ABORTED
    return EXIT_OK if card.ok else 1


def _show_row(reporter: ConsoleReporter, row: ScorecardRow, index: int, total: int) -> None:
    """One finished experiment's line: verdict, detection, recovery, reasons."""
    colour = "green" if row.verdict == "pass" else "red"
    detect = (
        f"detected by {row.alert} in {row.time_to_detect_seconds:.1f} s"
        if row.detected and row.time_to_detect_seconds is not None
        else "not detected"
    )
    recover = (
        f"recovered in {row.time_to_recover_seconds:.1f} s ({row.recovered_by})"
        if row.time_to_recover_seconds is not None
        else "no recovery measured"
    )
    reporter.console.print(
        f"[{colour}]{row.verdict}[/] [{index + 1}/{total}] {escape(row.title)}: "
        f"{detect}, {recover}" + (f"; {escape('; '.join(row.reasons))}" if row.reasons else ""),
        soft_wrap=True,
    )


def _check_target(target_file: Path) -> None:
    """Load the target file; refuse one that attaches to a running job.

    Raises:
        InvalidTargetFile: it is not valid.
        ConfigError: it has ``job.attach``: a suite starts one job per experiment.
    """
    from stormwatch.platforms.targets import load_target_file

    job = load_target_file(target_file).job
    if job is not None and job.attach is not None:
        raise ConfigError(
            f"--target {target_file}: job.attach: a suite starts one job per experiment "
            "(and per baseline), so it cannot run on one attached job; give a target "
            "file with job.submit (a job template), or run the suite on the lab"
        )


def _dry_run(
    entries: list[SuiteEntry], folder: Path, run_dir: Path, target_file: Path | None
) -> int:
    """Print every experiment's plan; exit 0, or raise when a run would refuse one."""
    from stormwatch.chaos.experiment.dryrun import (
        print_plan,
        refuse_unresolved,
        target_shape,
    )

    console = Console(highlight=False, soft_wrap=True)
    # the target when it can be reached, else each file's job
    resolved = target_shape(run_dir, target_file)
    refused = [
        f"{entry.path}: {why}"
        for entry in entries
        if (why := print_plan(entry.experiment, entry.path, console, resolved)) is not None
    ]
    if refused:
        raise ConfigError(
            f"suite {folder}: a run would refuse {plural(len(refused), 'experiment')}:\n"
            + "\n".join(refused)
        )
    refuse_unresolved(resolved, target_file)
    console.print(f"[green]{plural(len(entries), 'experiment')} valid[/]; nothing was run")
    return 0


__all__ = ["suite"]
