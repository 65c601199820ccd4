"""``stormwatch demo``: lab up, fault-free baseline, kill-rank experiment, post-mortem, lab down.

Steps (each says what it is doing while it runs):

1. clean ``--run-dir`` (default ``./run/demo``; an earlier lab there is brought down first);
2. bring the lab up (three nodes: a two-node job and a spare);
3. train the baseline job to completion (no faults);
4. run ``experiments/kill-rank.yaml`` against an identical job;
5. write the post-mortem (waits for the alert to be received and resolved);
6. print a summary table; bring the lab down unless ``--keep-lab``.

Exit status 0 only when the experiment's steady-state hypothesis held (and its
rollbacks succeeded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from stormwatch.chaos.console import ConsoleReporter
from stormwatch.chaos.errors import InvalidExperiment
from stormwatch.chaos.execution.runner import EXIT_ABORTED, ExperimentRun, Runner, run_experiment
from stormwatch.chaos.experiment.loader import load_experiment
from stormwatch.chaos.experiment.model import Experiment
from stormwatch.chaos.experiment.semantics import semantic_issues
from stormwatch.chaos.gameday.baseline import train_baseline
from stormwatch.chaos.reports.incidents import incident_postmortems
from stormwatch.chaos.reports.report import generate_postmortem
from stormwatch.chaos.target import lab_target
from stormwatch.clients.responder import ResponderClient
from stormwatch.errors import ConfigError
from stormwatch.lab import Lab, LabConfig, ProgressEvent
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.services.definitions import grafana_hint
from stormwatch.lab.teardown import removed_summary
from stormwatch.postmortem import ExperimentPostMortem

#: The demo's experiment in a source checkout; the packaged copy is used otherwise
#: (tests/chaos check that both are the same file).
REPO_EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "kill-rank.yaml"
PACKAGED_EXPERIMENT = Path(__file__).resolve().parent / "kill-rank.yaml"
BASELINE_JOB = "baseline"
#: What a run directory of ours may hold besides the lab's own entries
#: (:attr:`RunPaths.lab_entries`): the controller's; anything else and the demo refuses
#: to delete it.
#: The file that says a run directory is the demo's own (it deletes and rebuilds only those):
#: ``--run-dir run`` must never wipe a user's lab, experiments and ledger.
DEMO_MARKER = ".stormwatch-demo"
_CONTROLLER_ENTRIES = frozenset({"experiments", "chaos", DEMO_MARKER})
#: How long the post-mortem waits for the alert to be received and resolved (s). The
#: rank-stalled rule resolves ~20 s after the rank steps again (alerts/rules/ranks.yml).
RESOLVE_WAIT_SECONDS = 120.0


def _resolve_wait(run: ExperimentRun) -> float:
    """How long the post-mortem waits for the alert: not at all after an abort, briefly when
    the job did not recover (its alert may never resolve), else :data:`RESOLVE_WAIT_SECONDS`."""
    if run.exit_code == EXIT_ABORTED:
        return 0.0
    return RESOLVE_WAIT_SECONDS if run.journal.succeeded else 15.0


def default_experiment() -> Path:
    """The kill-rank experiment: the checkout's, or the packaged copy."""
    return REPO_EXPERIMENT if REPO_EXPERIMENT.exists() else PACKAGED_EXPERIMENT


def demo_experiment(path: Path, steps: int | None) -> Experiment:
    """Load the experiment; ``steps`` replaces ``job.steps`` (re-validated).

    Raises:
        InvalidExperiment: the file is invalid, or ``steps`` leaves no room for the fault.
    """
    experiment = load_experiment(path)
    if steps is None:
        return experiment
    given = experiment.job.steps
    job = experiment.job.model_copy(update={"steps": steps})
    experiment = experiment.model_copy(update={"job": job})
    issues = semantic_issues(experiment)
    if issues:  # the user's --steps caused them, not the file: say so (fresh-user pass)
        said = f" (job.steps {steps} is the demo's --steps; the file says {given})"
        raise InvalidExperiment(
            path, [dataclasses.replace(i, message=i.message + said) for i in issues]
        )
    return experiment


def clean_run_dir(run_dir: Path, console: Console) -> None:
    """Bring down a lab left in ``run_dir`` and delete the folder (only if it is ours: an
    earlier demo's, with :data:`DEMO_MARKER`, or empty).

    Raises:
        ConfigError: ``run_dir`` holds files that a run directory never has, or is a run
            directory the demo did not make (a user's lab: nothing is touched).
    """
    if not run_dir.exists():
        return
    entries = list(run_dir.iterdir())
    ours = RunPaths.of(run_dir).lab_entries | _CONTROLLER_ENTRIES
    foreign = sorted(p.name for p in entries if p.name not in ours)
    if foreign:
        raise ConfigError(
            f"--run-dir {run_dir}: refusing to delete it, it holds files that are not a "
            f"stormwatch run directory's ({', '.join(foreign[:5])}); choose another --run-dir"
        )
    if entries and not (run_dir / DEMO_MARKER).exists():
        raise ConfigError(
            f"--run-dir {run_dir}: refusing to delete it, it is a stormwatch run directory "
            "that `stormwatch demo` did not make (a lab's, with its experiments and fault "
            "ledger); the demo deletes and rebuilds its own: give it another --run-dir "
            "(default run/demo), or remove this one yourself (a run/demo made before this "
            "check has no marker either)"
        )
    if RunPaths.of(run_dir).state_file.exists():
        removed = Lab(run_dir).down()  # a no-op for a lab that is already down
        if removed:
            console.print(
                f"brought down the lab left in {run_dir} ({removed_summary(removed)})",
                soft_wrap=True,
            )
    shutil.rmtree(run_dir)


def _lab_progress(reporter: ConsoleReporter) -> Callable[[ProgressEvent], None]:
    def report(event: ProgressEvent) -> None:
        if event.kind in ("ready", "info"):
            reporter.event(f"  {event.message}")
        else:
            reporter.status(event.message)

    return report


def summary_table(run: ExperimentRun, pm: ExperimentPostMortem | None) -> Table:
    """The demo's closing table."""

    def secs(value: float | None, missing: str) -> str:
        return missing if value is None else f"{value:.1f} s"

    journal = run.journal
    table = Table(title="stormwatch demo: kill rank 1", show_header=True)
    table.add_column("measure")
    table.add_column("value")
    if pm is not None:
        table.add_row("alert", pm.alertname or "none fired")
        table.add_row("time to detect", secs(pm.time_to_detect_seconds, "not detected"))
        table.add_row("received by responder", "yes" if pm.alert_received_at else "no")
        table.add_row("time to recover", secs(pm.time_to_recover_seconds, "not recovered"))
        table.add_row("steps lost", "—" if pm.steps_lost is None else str(pm.steps_lost))
        identical = pm.loss.identical
        table.add_row(
            "loss identical to baseline",
            "n/a" if identical is None else ("yes" if identical else "NO"),
        )
    table.add_row("hypothesis held", "yes" if journal.hypothesis_held else "NO")
    table.add_row("status", journal.status)
    return table


@click.command("demo")
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("run/demo"),
    show_default=True,
    help="Run directory (deleted and recreated at the start).",
)
@click.option(
    "--steps",
    type=click.IntRange(min=2, max=100_000),
    default=None,
    help="Training steps of both jobs (default: the experiment's, 50).",
)
@click.option("--keep-lab", is_flag=True, help="Leave the lab up at the end (for inspection).")
@click.option(
    "--experiment",
    "experiment_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Experiment to run (default: experiments/kill-rank.yaml).",
)
def demo(run_dir: Path, steps: int | None, keep_lab: bool, experiment_file: Path | None) -> int:
    """Run the main job: the lab (a two-node job and a spare), baseline, kill-rank experiment, post-mortem.

    Needs root (network namespaces). Brings the lab up in --run-dir, trains a
    fault-free baseline, runs the kill-rank experiment against an identical
    job (SIGKILL rank 1 after step 25: detected by an alert, recovered from the
    step-20 checkpoint), writes RUN_DIR/experiments/<id>/postmortem.md and prints
    a summary. Exit 0 only when the steady-state hypothesis held.
    """
    if os.geteuid() != 0:
        raise ConfigError(
            "stormwatch demo needs root (it creates network namespaces): "
            "run `sudo .venv/bin/stormwatch demo` or `make demo`"
        )
    source = experiment_file or default_experiment()
    experiment = demo_experiment(source, steps)
    reporter = ConsoleReporter(Console())
    outcome = run_demo(
        run_dir=run_dir,
        experiment=experiment,
        source=source,
        lab_config=LabConfig(),
        keep_lab=keep_lab,
        reporter=reporter,
    )
    if outcome.run.exit_code == EXIT_ABORTED:
        return EXIT_ABORTED
    return 0 if outcome.run.journal.succeeded else 1


@dataclass(frozen=True)
class DemoOutcome:
    """What :func:`run_demo` produced: the experiment run, the post-mortem and its Markdown file."""

    run: ExperimentRun
    postmortem: ExperimentPostMortem
    postmortem_file: Path
    incident_postmortems: list[Path]


def _incident_postmortems(
    run_dir: Path, run: ExperimentRun, pm: ExperimentPostMortem, reporter: ConsoleReporter
) -> list[Path]:
    """Wait for the responder's post-mortem of each incident the experiment closed (it writes
    them a few seconds after the close) before the lab, its Prometheus and the responder go
    down; print where they are (:mod:`stormwatch.chaos.reports.incidents`)."""
    target = lab_target(run_dir)
    try:  # the experiment is over: a responder that cannot be asked is said, not raised
        client = ResponderClient(str(target.responder_url), token_file=target.responder_token_file)
    except ConfigError as exc:
        reporter.event(f"  the responder's incident post-mortems: {exc}")
        return []
    pages = asyncio.run(
        incident_postmortems(
            client,
            since=run.journal.started_at,
            folder=RunPaths.of(run_dir).responder_postmortems,
            reporter=reporter,
            # The experiment's alert resolved: its incident closes a notification later.
            closing=lambda incident: (
                pm.alert_resolved_at is not None and incident.alertname == pm.alertname
            ),
        )
    )
    reporter.stop()
    for page in pages:
        reporter.console.print(
            f"responder's incident post-mortem: {page.with_suffix('.md')}, {page}",
            soft_wrap=True,
        )
    return pages


def run_demo(
    *,
    run_dir: Path,
    experiment: Experiment,
    source: Path,
    lab_config: LabConfig,
    keep_lab: bool,
    reporter: ConsoleReporter,
) -> DemoOutcome:
    """The demo's steps (module docstring) with a given lab configuration.

    Raises:
        ConfigError: ``run_dir`` is not ours to delete; LabError: the lab failed;
        ChaosError: the baseline failed.
    """
    console = reporter.console
    run_dir = run_dir.absolute()
    clean_run_dir(run_dir, console)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / DEMO_MARKER).write_text(
        "made by `stormwatch demo`: its next run deletes and rebuilds this folder\n",
        encoding="utf-8",
    )
    lab = Lab(run_dir)
    try:
        console.rule("1/4 lab up")
        lab.up(lab_config, progress=_lab_progress(reporter))
        console.rule("2/4 baseline (no faults)")
        job = experiment.job
        # Without the experiment's step delay, as a suite's baselines: the delay is there to
        # watch the fault happen and changes no loss; the baseline only has to finish.
        baseline = train_baseline(
            lab_target(run_dir).jobs, BASELINE_JOB, job, reporter, step_delay=0.0
        )
        reporter.event(f"  baseline finished: {job.steps} steps, logs in {baseline.log_dir}")
        console.rule("3/4 experiment")
        runner = Runner(experiment, source=source, target=lab_target(run_dir), reporter=reporter)
        reporter.event(f"experiment {runner.experiment_id}: {experiment.title}")
        run = run_experiment(runner)
        reporter.stop()
        console.rule("4/4 post-mortem")
        pm, md = asyncio.run(
            generate_postmortem(
                runner.experiment_dir,
                target=lab_target(run_dir),
                baseline_log_dir=run_dir / "jobs" / BASELINE_JOB / "logs",
                wait_resolved_seconds=_resolve_wait(run),
                reporter=reporter,
            )
        )
        reporter.stop()
        console.print(summary_table(run, pm))
        console.print(f"post-mortem: {md}\njournal: {run.journal_path}", soft_wrap=True)
        pages = _incident_postmortems(run_dir, run, pm, reporter)
        hint = grafana_hint(RunPaths.of(run_dir).grafana_dir)
        if not keep_lab:  # its Prometheus goes down with the lab
            hint += (
                " (the lab's Prometheus is down after the demo: keep it with --keep-lab,"
                " or `make demo DEMO_ARGS=--keep-lab`)"
            )
        console.print(hint, soft_wrap=True)
        return DemoOutcome(run, pm, md, pages)
    finally:
        reporter.stop()
        if keep_lab:
            console.print(
                f"lab left up in {run_dir}: `stormwatch lab down --run-dir {run_dir}`",
                soft_wrap=True,
            )
        else:
            console.rule("lab down")
            removed = lab.down(progress=_lab_progress(reporter))
            reporter.stop()
            console.print(f"lab down: {removed_summary(removed)}", soft_wrap=True)


__all__ = [
    "DemoOutcome",
    "clean_run_dir",
    "default_experiment",
    "demo",
    "demo_experiment",
    "run_demo",
    "summary_table",
]
