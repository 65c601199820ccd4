"""``stormwatch plan``: goodput (ETTR) planning from failure rates and detect/recover times."""

from __future__ import annotations

import math
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from stormwatch.plan.errors import InvalidPlanInput
from stormwatch.plan.fromscorecard import find_scorecard, read_scorecard_times
from stormwatch.plan.inputs import (
    FailureTable,
    PlanSettings,
    load_failure_table,
    make_settings,
)
from stormwatch.plan.planner import PlanReport, build_plan
from stormwatch.plan.postmortems import MeasuredTimes, read_postmortems
from stormwatch.plan.report import write_report


def _default(field: str) -> object:
    """The default of a :class:`PlanSettings` field (one source of truth for CLI and library)."""
    return PlanSettings.model_fields[field].default


def _pairs(flag: str, values: tuple[str, ...], table: FailureTable) -> dict[str, float]:
    """``CATEGORY=SECONDS`` values of ``flag`` (``--detect``, ``--recover``) as a dict.

    Raises:
        InvalidPlanInput: not ``CATEGORY=SECONDS``, a category not in ``table`` (the
            message lists the valid ones), or seconds that are negative or not finite.
    """
    out: dict[str, float] = {}
    for value in values:
        cat, sep, secs = value.partition("=")
        cat = cat.strip()
        try:
            seconds = float(secs)
        except ValueError:
            sep = ""
        if not sep or not cat:
            raise InvalidPlanInput(
                f"{flag}: expected CATEGORY=SECONDS, e.g. software_bug=30 (got {value!r})"
            )
        if cat not in table.ids:
            raise InvalidPlanInput(
                f"{flag}: unknown category {cat!r} (valid: {', '.join(table.ids)}); "
                f"e.g. {flag} software_bug=30"
            )
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise InvalidPlanInput(
                f"{flag}: {cat}={secs.strip()}: seconds must be a finite number >= 0"
            )
        out[cat] = seconds
    return out


def _show(report: PlanReport, console: Console) -> None:
    s = report.settings
    console.print(
        f"[bold]{s.gpus:,} GPUs[/]: job MTTF [bold]{report.mttf_hours:.2f} h[/], "
        f"~{report.expected_failures:.0f} failures in {s.days:g} days "
        f"({report.table_failures} on {report.table_gpus:,} GPUs in {report.table_days:g} days, scaled)"
    )
    table = Table(title="ETTR (goodput) what-ifs", title_justify="left")
    table.add_column("scenario")
    columns = ("δ s", "down s", "ETTR now", "Young min", "Daly min", "ETTR @Daly", "MC @Daly ±95%")
    for col in columns:
        table.add_column(col, justify="right")
    for r in report.scenarios:
        table.add_row(
            r.name,
            f"{r.checkpoint_write_s:g}",
            f"{r.mean_downtime_s:.0f}",
            f"{100 * r.ettr_renewal:.2f}%",
            f"{r.young_interval_s / 60:.1f}",
            f"{r.daly_interval_s / 60:.1f}",
            f"{100 * r.ettr_renewal_opt:.2f}%",
            f"{100 * r.mc_opt.mean:.2f}±{100 * (r.mc_opt.ci_high - r.mc_opt.ci_low) / 2:.2f}%",
        )
    console.print(table)
    console.print(
        "Checkpoint intervals (minutes of compute between checkpoints): Young = Young (1974) "
        "sqrt(2 δ MTTF); Daly = Daly (2006) higher-order estimate, the one the @Daly columns use.",
        soft_wrap=True,
    )
    t = report.target
    console.print(
        f"To reach {t.target_ettr:.0%} ETTR on {t.gpus:,} GPUs (MTTF {t.mttf_hours:.2f} h):"
    )
    for row in t.rows:
        if row.max_downtime_s is None:
            console.print(
                f"  {row.label}: unreachable (ceiling {100 * row.ceiling_ettr:.2f}% "
                f"with δ={row.checkpoint_write_s:g} s even at zero downtime)"
            )
        else:
            console.print(
                f"  {row.label}: downtime per failure ≤ {row.max_downtime_s:.0f} s "
                f"(detect + recover ≤ {row.max_detect_plus_recover_s:.0f} s; "
                f"this plan: {row.current_downtime_s:.0f} s)"
            )


def _measured(
    table: FailureTable,
    postmortems: Path | None,
    scorecard: Path | None,
    run_dir: Path,
    no_scorecard: bool,
    console: Console,
) -> MeasuredTimes | None:
    """Measured times: --from-postmortems, else --scorecard, else the latest scorecard under
    --run-dir, else None (the documented defaults), saying which on the console."""
    if postmortems is not None:
        measured = read_postmortems(postmortems)
        console.print(
            f"detect/recover times: measured by {len(measured.used)} post-mortem(s) under "
            f"{postmortems} for {', '.join(sorted(measured.times))}; documented defaults for "
            "the other categories",
            soft_wrap=True,
        )
        return measured
    if no_scorecard:
        console.print("detect/recover times: documented defaults (--no-scorecard)")
        return None
    if scorecard is not None and not scorecard.is_file():
        what = "is a folder" if scorecard.is_dir() else "does not exist"
        raise InvalidPlanInput(
            f"--scorecard: {scorecard} {what}; give a RUN_DIR/suites/<suite-id>/scorecard.json "
            "written by `stormwatch chaos suite` (or leave --scorecard out to use the latest)"
        )
    path = scorecard or find_scorecard(run_dir)
    if path is None:
        console.print(
            f"detect/recover times: no game-day scorecard under {run_dir}/suites, so the "
            "documented defaults (plan/inputs.py); run `stormwatch chaos suite` to "
            "measure them",
            soft_wrap=True,
        )
        return None
    measured = read_scorecard_times(path, table)
    if not measured.times:
        if scorecard is not None:
            raise InvalidPlanInput(
                f"--scorecard {scorecard}: no experiment of it was detected and recovered with "
                "a failure category; nothing to plan with"
            )
        console.print(
            f"detect/recover times: the latest scorecard ({path}) measured no failure category "
            "(nothing detected and recovered), so the documented defaults (plan/inputs.py)",
            soft_wrap=True,
        )
        return None
    console.print(
        f"detect/recover times: from {path} for {', '.join(sorted(measured.times))}; "
        "documented defaults for the other categories",
        soft_wrap=True,
    )
    return measured


@click.command("plan")
@click.option(
    "--gpus", type=int, required=True, help="GPUs in the job (failure rate scales linearly)."
)
@click.option(
    "--days",
    type=float,
    default=_default("days"),
    show_default=True,
    help="Wall-clock length of the run.",
)
@click.option(
    "--interval",
    "interval_s",
    type=float,
    default=_default("interval_s"),
    show_default=True,
    help="Current checkpoint interval, seconds of compute between checkpoints.",
)
@click.option(
    "--checkpoint-write",
    "checkpoint_write_s",
    type=float,
    default=_default("checkpoint_write_s"),
    show_default=True,
    help="Seconds training is blocked per checkpoint.",
)
@click.option(
    "--checkpoint-load",
    "checkpoint_load_s",
    type=float,
    default=_default("checkpoint_load_s"),
    show_default=True,
    help="Seconds to load a checkpoint after a restart.",
)
@click.option(
    "--detect-time",
    "detect_s",
    type=float,
    default=_default("detect_s"),
    show_default=True,
    help="Default seconds from failure to detection (crashes, hardware errors).",
)
@click.option(
    "--hang-detect-time",
    "hang_detect_s",
    type=float,
    default=_default("hang_detect_s"),
    show_default=True,
    help="Seconds to detect a hang (NCCL watchdog, network); PyTorch's default NCCL timeout.",
)
@click.option(
    "--restart",
    "restart_s",
    type=float,
    default=_default("restart_s"),
    show_default=True,
    help="Seconds from detection to the job relaunched.",
)
@click.option(
    "--replace",
    "replace_s",
    type=float,
    default=_default("replace_s"),
    show_default=True,
    help="Extra seconds to replace a node after a hardware failure.",
)
@click.option(
    "--in-memory-write",
    "in_memory_write_s",
    type=float,
    default=_default("in_memory_write_s"),
    show_default=True,
    help="What-if: checkpoint write with in-memory checkpoints.",
)
@click.option(
    "--in-memory-load",
    "in_memory_load_s",
    type=float,
    default=_default("in_memory_load_s"),
    show_default=True,
    help="What-if: checkpoint load with in-memory checkpoints.",
)
@click.option(
    "--spare-swap",
    "spare_swap_s",
    type=float,
    default=_default("spare_swap_s"),
    show_default=True,
    help="What-if: seconds to swap in a hot spare (replaces --replace).",
)
@click.option(
    "--detect",
    "detect",
    multiple=True,
    metavar="CATEGORY=SECONDS",
    help="Per-category time to detect (repeatable).",
)
@click.option(
    "--recover",
    "recover",
    multiple=True,
    metavar="CATEGORY=SECONDS",
    help="Per-category time from detection to relaunch (repeatable).",
)
@click.option(
    "--rates",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Failure table YAML (default: Llama 3 Table 5, 419 interruptions).",
)
@click.option(
    "--from-postmortems",
    "postmortems",
    type=click.Path(path_type=Path),
    default=None,
    help="Run dir: take measured detect/recover times from experiments/*/postmortem.json.",
)
@click.option(
    "--scorecard",
    "scorecard",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Game-day scorecard.json to take per-category detect/recover times from "
    "(default: the latest under --run-dir).",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("run"),
    envvar="STORMWATCH_LAB_DIR",
    show_default=True,
    show_envvar=True,
    help="Where to look for the latest scorecard (RUN_DIR/suites/*/scorecard.json).",
)
@click.option(
    "--no-scorecard",
    is_flag=True,
    help="Ignore scorecards: use the documented default detect/recover times.",
)
@click.option(
    "--replicas",
    type=int,
    default=_default("replicas"),
    show_default=True,
    help="Monte Carlo replicas.",
)
@click.option(
    "--seed", type=int, default=_default("seed"), show_default=True, help="Monte Carlo seed."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write report.md, report.json and PNG plots here.",
)
def plan(
    detect: tuple[str, ...],
    recover: tuple[str, ...],
    rates: Path | None,
    postmortems: Path | None,
    scorecard: Path | None,
    run_dir: Path,
    no_scorecard: bool,
    out_dir: Path | None,
    **values: float,
) -> int:
    """Goodput at scale: optimal checkpoint interval, ETTR and what-ifs.

    Failure rates per root-cause category (default: 419 unexpected interruptions on
    16,384 H100s in 54 days, Llama 3 paper Table 5) scale linearly with --gpus. Prints
    Young's and Daly's optimal checkpoint intervals, the effective training time ratio
    (analytic and Monte Carlo with 95% CIs) at the current and the optimal interval,
    what-ifs (faster detection/restart, in-memory checkpoints, hot spares) and the
    detect + recover time needed for 97% ETTR on 9,600 GPUs (ByteRobust).

    \b
    Example:
      stormwatch plan --gpus 16384 --out run/plan
      stormwatch plan --gpus 9600 --days 90 --from-postmortems run/demo
      stormwatch plan --gpus 16384 --scorecard run/suites/<id>/scorecard.json

    Per-category detect/recover times come from --from-postmortems, else from
    --scorecard, else from the latest game-day scorecard under --run-dir
    (`stormwatch chaos suite`), else the documented defaults; the output says which.
    """
    table = load_failure_table(rates)
    options = click.get_current_context().command.params
    settings = make_settings(
        {o.name: o.opts[0] for o in options if o.name is not None},  # errors name the option
        **values,
        detect_overrides=_pairs("--detect", detect, table),
        recover_overrides=_pairs("--recover", recover, table),
    )
    console = Console()
    measured = _measured(table, postmortems, scorecard, run_dir, no_scorecard, console)
    report, scenarios = build_plan(table, settings, measured)
    if out_dir is not None:
        report = write_report(report, table, scenarios, out_dir)
    _show(report, console)
    if out_dir is not None:
        console.print(f"report: {out_dir / 'report.md'} (+ report.json, {', '.join(report.plots)})")
    return 0


__all__ = ["plan"]
