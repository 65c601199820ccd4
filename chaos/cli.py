"""``stormwatch chaos``: validate, run and revert experiments; list the ledger; write post-mortems."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stormwatch.chaos.console import ConsoleReporter
from stormwatch.chaos.errors import ChaosError, InvalidExperiment
from stormwatch.chaos.execution.runner import (
    EXIT_ABORTED,
    EXIT_OK,
    Runner,
    RunnerConfig,
    run_experiment,
)
from stormwatch.chaos.experiment.loader import load_experiment
from stormwatch.chaos.gameday.scorecard import ScorecardRow
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.ledger.revert import RevertOutcome, revert_entries, revert_overdue
from stormwatch.chaos.reports.verify import Verification, write_verification
from stormwatch.contracts.fault_ledger import LedgerEntry
from stormwatch.contracts.journal import Journal
from stormwatch.errors import ConfigError

_RUN_DIR = click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("run"),
    envvar="STORMWATCH_LAB_DIR",
    show_default=True,
    show_envvar=True,
    help="The lab's run directory (lab.json, fault ledger, experiments/).",
)
#: Where ``stormwatch demo`` keeps its run (hinted when the default run dir has no ledger).
_DEMO_RUN_DIR = Path("run/demo")


def _plural(count: int, word: str) -> str:
    """``1 rollback``, ``2 rollbacks``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


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


def reap_overdue(run_dir: Path) -> list[RevertOutcome]:
    """Revert faults past their TTL in ``run_dir``'s ledger (their controller and reaper
    died) and say so on stderr; every command that takes --run-dir does this first."""
    outcomes = revert_overdue(run_dir)
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    for outcome in outcomes:
        if outcome.ok:
            console.print(
                f"[yellow]reverted overdue fault[/] {outcome.fault_id} "
                f"(past its TTL; its controller and reaper are gone): {escape(outcome.detail)}"
            )
        else:
            console.print(
                f"[red]overdue fault {outcome.fault_id} could not be reverted:[/] "
                f"{escape(outcome.detail)}"
            )
    return outcomes


@click.group("chaos")
def chaos() -> None:
    """Run chaos experiments against the lab and undo their faults.

    An experiment (YAML) has a steady-state hypothesis checked before and after
    a method that injects faults; every fault is written to a durable ledger
    before it is sent, and rolled back however the run ends.

    \b
      stormwatch chaos validate experiments/kill-rank.yaml
      stormwatch chaos run experiments/kill-rank.yaml --run-dir run
      stormwatch chaos run experiments/kill-rank.yaml --dry-run
      stormwatch chaos suite experiments/suite --run-dir run
      stormwatch chaos revert --all --run-dir run
    """


@chaos.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def validate(files: tuple[Path, ...]) -> None:
    """Check experiment FILES without running anything (exit 2 when one is invalid)."""
    console = Console()
    problems: list[InvalidExperiment] = []
    for file in files:
        try:
            experiment = load_experiment(file)
        except InvalidExperiment as exc:
            problems.append(exc)
            continue
        console.print(
            f"[green]ok[/] {file}: {experiment.title!r} "
            f"({_activities(len(experiment.method))}, "
            f"{_plural(len(experiment.rollbacks), 'rollback')})",
            soft_wrap=True,
        )
    if len(problems) == 1 and len(files) == 1:
        raise problems[0]
    if problems:
        raise ConfigError("\n".join(str(p) for p in problems))


@chaos.command()
@click.argument("experiment", type=click.Path(path_type=Path))
@_RUN_DIR
@click.option(
    "--job",
    "job",
    metavar="NAME",
    help="Attach to this running lab job instead of starting the experiment's job.",
)
@click.option(
    "--baseline-job",
    metavar="NAME",
    help="Fault-free job of the lab to compare the loss against in the post-mortem.",
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
    "--dry-run", is_flag=True, help="Validate and print the plan (targets resolved); run nothing."
)
def run(
    experiment: Path,
    run_dir: Path,
    job: str | None,
    baseline_job: str | None,
    postmortem: bool,
    wait_resolved: float,
    dry_run: bool,
) -> int:
    """Run EXPERIMENT against the lab in --run-dir.

    The file is validated first (exit 2, nothing started, when invalid), then the
    lab is checked, the job started (or attached with --job), and the experiment
    run; the journal goes to RUN_DIR/experiments/<id>/journal.json. Ctrl-C stops
    injecting, reverts the faults and still writes the journal.

    Exit status: 0 when the hypothesis held before and after and every rollback
    succeeded; 1 otherwise; 130 when interrupted; 2 for an invalid experiment or
    a lab that is not up.
    """
    from stormwatch.chaos.reports.report import generate_postmortem
    from stormwatch.chaos.target import lab_target

    spec = load_experiment(experiment)
    if dry_run:
        from stormwatch.chaos.execution.dryrun import lab_shape, print_plan

        refused = print_plan(
            spec, experiment, Console(highlight=False, soft_wrap=True), lab_shape(run_dir)
        )
        if refused is not None:
            raise ConfigError(f"{experiment}: a run would refuse this plan: {refused}")
        return EXIT_OK
    reap_overdue(run_dir)
    target = lab_target(run_dir)
    reporter = ConsoleReporter()
    runner = Runner(
        spec,
        source=experiment,
        target=target,
        config=RunnerConfig(attach_job=job),
        reporter=reporter,
    )
    reporter.event(f"experiment {runner.experiment_id}: {spec.title}")
    result = run_experiment(runner)
    reporter.stop()
    journal = result.journal
    if postmortem and journal.job is not None:
        baseline = (target.run_dir / "jobs" / baseline_job / "logs") if baseline_job else None
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


def _print_verification(result: Verification, console: Console) -> None:
    """One line per check of :mod:`stormwatch.chaos.reports.verify` (ok / FAILED / not checked)."""
    for name, check in (
        ("loss", result.loss),
        ("checkpoint", result.checkpoint),
        ("faults cleared", result.faults_cleared),
    ):
        mark = {True: "[green]ok[/]", False: "[red]FAILED[/]", None: "[yellow]not checked[/]"}
        console.print(f"{name}: {mark[check.ok]}: {escape(check.detail)}", soft_wrap=True)


@chaos.command()
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
@_RUN_DIR
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
    "--dry-run", is_flag=True, help="Validate every experiment and print its plan; run nothing."
)
def suite(folder: Path, run_dir: Path, baseline: bool, wait_detected: float, dry_run: bool) -> int:
    """Run every experiment in DIR on the lab, one after another, and write a scorecard.

    All files are validated first (exit 2, nothing started, when one is invalid).
    The scorecard (per fault: detected?, by which alert, time to detect, time to
    recover, steps lost, loss/checkpoint/fault checks, verdict) is written as
    Markdown and JSON to RUN_DIR/suites/<suite-id>/ after every experiment.
    Ctrl-C rolls the running experiment back and skips the rest.

    \b
      stormwatch chaos suite experiments/suite --run-dir run
      make game-day

    Exit status: 0 when every experiment passed; 1 otherwise; 130 when interrupted;
    2 for an invalid experiment or a lab that is not up.
    """
    from stormwatch.chaos.execution.dryrun import lab_shape, print_plan
    from stormwatch.chaos.gameday.suite import SuiteOptions, SuiteRunner, load_suite
    from stormwatch.chaos.target import lab_target

    entries = load_suite(folder)
    if dry_run:
        console = Console(highlight=False, soft_wrap=True)
        shape = lab_shape(run_dir)  # the lab in --run-dir when it is up, else each file's job
        refused = [
            f"{entry.path}: {why}"
            for entry in entries
            if (why := print_plan(entry.experiment, entry.path, console, shape)) is not None
        ]
        if refused:
            raise ConfigError(
                f"suite {folder}: a run would refuse {_plural(len(refused), 'experiment')}:\n"
                + "\n".join(refused)
            )
        console.print(f"[green]{_plural(len(entries), 'experiment')} valid[/]; nothing was run")
        return 0
    reap_overdue(run_dir)
    target = lab_target(run_dir)
    reporter = ConsoleReporter()

    def show(row: ScorecardRow, index: int, total: int) -> None:
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

    runner = SuiteRunner(
        entries,
        folder=folder,
        target=target,
        options=SuiteOptions(baseline=baseline, wait_detected_seconds=wait_detected),
        reporter=reporter,
        on_row=show,
    )
    reporter.event(f"suite {runner.suite_id}: {_plural(len(entries), 'experiment')} in {folder}")
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


@chaos.command()
@click.option("--all", "all_", is_flag=True, help="Revert every open fault in the ledger.")
@click.argument("fault_ids", nargs=-1)
@_RUN_DIR
def revert(all_: bool, fault_ids: tuple[str, ...], run_dir: Path) -> int:
    """Revert open faults recorded in the ledger (idempotent; safe after a controller crash).

    Give --all or FAULT_IDS. Exit 1 when a fault could not be reverted (it stays
    open in the ledger; the agent still reverts it at its TTL).
    """
    if all_ and fault_ids:
        raise ConfigError(
            f"--all and FAULT_IDS ({' '.join(fault_ids)}) together: give one of them "
            "(the run directory is --run-dir, e.g. `stormwatch chaos revert --all --run-dir run`)"
        )
    if not all_ and not fault_ids:
        raise ConfigError("nothing to revert: give --all or one or more FAULT_IDS")
    reap_overdue(run_dir)
    path = ledger_path(run_dir)
    console = Console()
    if not path.exists():
        if fault_ids:  # named faults cannot be in a ledger that does not exist
            raise ConfigError(
                f"no fault ledger at {path}, so no fault {', '.join(fault_ids)}; check "
                "--run-dir (the run directory the experiment ran in)"
            )
        console.print(f"no fault ledger at {path}: nothing to revert")
        return 0
    ledger = Ledger(path, create=False)
    if all_:
        entries = ledger.open_faults()
    else:
        known = {e.id: e for e in ledger.entries()}
        unknown = [i for i in fault_ids if i not in known]
        if unknown:
            raise ConfigError(
                f"not in the ledger {path}: {', '.join(unknown)}; nothing was reverted. "
                f"List the faults with `stormwatch chaos ledger --run-dir {run_dir}`"
            )
        entries = [known[i] for i in fault_ids]

    async def go() -> list[RevertOutcome]:
        async with aiohttp.ClientSession() as session:
            return await revert_entries(ledger, entries, reason="chaos revert", session=session)

    outcomes = asyncio.run(go()) if entries else []
    if not outcomes and not ledger.unreadable:
        console.print("no open faults: nothing to revert")
        return 0
    for outcome in outcomes:
        mark = "[green]reverted[/]" if outcome.ok else "[red]FAILED[/]"
        console.print(f"{mark} {outcome.fault_id}: {outcome.detail}", soft_wrap=True)
    _report_unreadable(console, ledger)
    return 0 if all(o.ok for o in outcomes) and not ledger.unreadable else 1


def _report_unreadable(console: Console, ledger: Ledger) -> None:
    """Name the ledger rows that could not be read (their faults were not reverted)."""
    for fault_id, why in ledger.unreadable.items():
        console.print(
            f"[red]UNREADABLE[/] {escape(fault_id)}: {escape(why)}; not reverted. Revert it by "
            "hand if it is still applied, then delete the row: "
            f"sqlite3 {escape(str(ledger.path))} \"DELETE FROM faults WHERE id='{escape(fault_id)}'\"",
            soft_wrap=True,
        )


@chaos.command("ledger")
@_RUN_DIR
@click.option("--open", "only_open", is_flag=True, help="Only faults not reverted yet.")
def ledger_cmd(run_dir: Path, only_open: bool) -> None:
    """List the faults in the ledger (what, where, when, state).

    Faults past their TTL are reverted first; one still open after its TTL (its
    revert failed) is marked OVERDUE. One line per fault: narrower than 120
    columns it shows fault, kind, rank/node, state and age (long ids end in "…").
    """
    path = ledger_path(run_dir)
    if not path.exists():
        hint = ""
        demo = ledger_path(_DEMO_RUN_DIR)
        if run_dir == Path("run") and demo.exists():
            hint = f"; the demo's is at {demo}: `stormwatch chaos ledger --run-dir {_DEMO_RUN_DIR}`"
        raise ChaosError(f"no fault ledger at {path}{hint}")
    reap_overdue(run_dir)
    ledger = Ledger(path, create=False)
    entries = ledger.open_faults() if only_open else ledger.entries()
    console = Console()
    console.print(_ledger_table(entries, now=time.time(), width=console.width))
    _report_unreadable(console, ledger)
    if ledger.unreadable:
        raise click.exceptions.Exit(1)


#: From this terminal width on, ``chaos ledger`` also shows where, expires and the full state.
_LEDGER_WIDE_COLUMNS = 120


def _ledger_table(entries: list[LedgerEntry], *, now: float, width: int) -> Table:
    """The ledger as a table with one line per fault at any ``width`` (columns).

    Narrower than :data:`_LEDGER_WIDE_COLUMNS`: fault, kind, rank/node, state (one
    word) and age (since injected, else recorded); wide: also where, expires and the
    state's times, revert reason and last error. Long cells end in "…".
    """
    from stormwatch.tables import Col, one_line_table, short_age

    wide = width >= _LEDGER_WIDE_COLUMNS
    columns = [Col(header="fault", flex=True, min_width=24), Col(header="kind")]
    columns.append(Col(header="rank/node", flex=True, min_width=9))
    if wide:
        columns += [Col(header="where"), Col(header="expires")]
        columns.append(Col(header="state", flex=True, min_width=20))
    else:
        columns += [Col(header="state"), Col(header="age")]
    rows = []
    for e in entries:
        overdue = e.open and e.expires_at <= now
        rank = e.spec.target_rank()
        what = str(rank) if rank is not None else ",".join(e.spec.target_nodes()) or "-"
        if wide:
            where = e.target.node or (f"pid {e.target.pid}" if e.target.pid else "?")
            state: str = e.state
            if e.injected_at:
                state += f", injected {_t(e.injected_at)}"
            if e.reverted_at:
                state += f" {_t(e.reverted_at)} by {e.revert_reason}"
            state = escape(state)
            if overdue:
                state = f"[red]OVERDUE[/] ({state}; TTL passed {_t(e.expires_at)}"
                state += f"; {escape(e.last_error)})" if e.last_error else ")"
            cells = [escape(e.id), e.kind, escape(what), escape(where), _t(e.expires_at), state]
        else:
            state = "[red]OVERDUE[/]" if overdue else e.state
            age = short_age(now - (e.injected_at or e.recorded_at))
            cells = [escape(e.id), e.kind, escape(what), state, age]
        rows.append(cells)
    return one_line_table(columns, rows, width=width)


@chaos.command("postmortem")
@click.argument("experiment_dir", type=click.Path(file_okay=False, path_type=Path))
@_RUN_DIR
@click.option(
    "--baseline-log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Rank logs of the fault-free baseline job (…/jobs/<name>/logs).",
)
@click.option(
    "--offline",
    is_flag=True,
    help="Use the saved evidence.json instead of querying the lab's Prometheus and responder.",
)
@click.option(
    "--wait-resolved",
    type=click.FloatRange(0, 3600),
    default=0.0,
    show_default=True,
    help="Seconds to wait for the alert to be received and resolved.",
)
def postmortem_cmd(
    experiment_dir: Path,
    run_dir: Path,
    baseline_log_dir: Path | None,
    offline: bool,
    wait_resolved: float,
) -> None:
    """(Re)write postmortem.md/.json for EXPERIMENT_DIR.

    EXPERIMENT_DIR is a folder (RUN_DIR/experiments/<id>) or just the experiment id,
    looked up in --run-dir.
    """
    from stormwatch.chaos.reports.report import generate_postmortem
    from stormwatch.chaos.target import lab_target

    if not experiment_dir.is_dir():
        candidate = run_dir / "experiments" / experiment_dir
        if len(experiment_dir.parts) != 1 or not candidate.is_dir():
            raise ConfigError(
                f"EXPERIMENT_DIR {experiment_dir}: no such folder (nor {candidate}); give "
                "RUN_DIR/experiments/<id> or an id of an experiment in --run-dir"
            )
        experiment_dir = candidate
    if not (experiment_dir / "journal.json").is_file():
        raise ConfigError(
            f"{experiment_dir} is not an experiment directory (no journal.json); give "
            "RUN_DIR/experiments/<id> or an id of an experiment in --run-dir"
        )

    if not offline:
        reap_overdue(experiment_dir.parent.parent)
    target = None if offline else lab_target(experiment_dir.parent.parent)
    _, md = asyncio.run(
        generate_postmortem(
            experiment_dir,
            target=target,
            baseline_log_dir=baseline_log_dir,
            wait_resolved_seconds=wait_resolved,
        )
    )
    Console().print(md.read_text(encoding="utf-8"), markup=False, highlight=False)


def _t(at: float | None) -> str:
    return "" if at is None else time.strftime("%H:%M:%S", time.localtime(at))


__all__ = ["chaos", "reap_overdue"]
