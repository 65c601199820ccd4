"""Write the plan: ``report.md`` (Markdown), ``report.json`` (:class:`.PlanReport`), PNGs."""

from __future__ import annotations

from pathlib import Path

from stormwatch.plan.errors import PlanError
from stormwatch.plan.inputs import FailureTable
from stormwatch.plan.planner import PlanReport
from stormwatch.plan.plots import plot_ettr_vs_gpus, plot_ettr_vs_interval
from stormwatch.plan.whatif import McSummary, Scenario


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _ci(mc: McSummary) -> str:
    return f"{_pct(mc.mean)} [{100 * mc.ci_low:.2f}, {100 * mc.ci_high:.2f}]"


def _mins(s: float) -> str:
    return f"{s / 60:.1f} min"


def render_markdown(report: PlanReport) -> str:
    """The Markdown report for ``report`` (plots linked by file name)."""
    out = _summary(report) + _model() + _what_ifs(report) + _target(report)
    out += _categories(report)
    if report.postmortems_used or report.postmortems_skipped:
        out += ["", "## Post-mortems", ""]
        out += [f"* used: {u}" for u in report.postmortems_used]
        out += [f"* skipped: {u}" for u in report.postmortems_skipped]
    if report.plots:
        out += ["", "## Plots", ""]
        out += [f"![{Path(p).stem}]({p})" for p in report.plots]
    return "\n".join(out) + "\n"


def _summary(report: PlanReport) -> list[str]:
    """Title, the failure table's rate and the run's settings."""
    s = report.settings
    return [
        f"# Resilience plan: {s.gpus:,} GPUs, {s.days:g} days",
        "",
        f"Failure rates: {report.source} — {report.table_failures} interruptions on "
        f"{report.table_gpus:,} GPUs over {report.table_days:g} days, "
        f"{report.per_gpu_rate_per_hour:.3g} per GPU-hour, scaled linearly to {s.gpus:,} GPUs.",
        "",
        f"* job-level MTTF: **{report.mttf_hours:.2f} h**; expected failures over the run: "
        f"{report.expected_failures:.0f}",
        f"* checkpoint write {s.checkpoint_write_s:g} s (blocking), load {s.checkpoint_load_s:g} s, "
        f"current interval {_mins(s.interval_s)}",
        f"* Monte Carlo: {s.replicas} replicas of the whole run, seed {s.seed}; 95% CIs of the mean",
        "",
    ]


def _model() -> list[str]:
    """The model and its sources (fixed text)."""
    return [
        "## Model",
        "",
        "ETTR = productive training time / wall time (Kokolis et al., arXiv:2410.21680). "
        "Failures are Poisson in running time. Each failure loses detect + recover + checkpoint "
        "load, plus the work since the last checkpoint (on average half a period); each period "
        "of tau compute pays delta to write a checkpoint. First order: "
        "`ETTR = tau/(tau+delta) * (1 - (D + (tau+delta)/2)/M)`; exact renewal: "
        "`ETTR = tau / ((exp((tau+delta)/M) - 1) * (M + D))`. Optimal interval: Young (1974) "
        "`sqrt(2 delta M)` and Daly (2006) higher-order estimate.",
        "",
    ]


def _what_ifs(report: PlanReport) -> list[str]:
    """One table row per what-if scenario."""
    out = [
        "## What-ifs",
        "",
        "| scenario | change | delta (s) | mean detect (s) | mean downtime/failure (s) "
        "| ETTR @ current (first order / renewal / MC) | Young | Daly | ETTR @ Daly (renewal) "
        "| MC @ Daly [95% CI] | GPU-h lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.scenarios:
        out.append(
            f"| {r.name} | {r.description} | {r.checkpoint_write_s:g} | {r.mean_detect_s:.0f} "
            f"| {r.mean_downtime_s:.0f} | {_pct(r.ettr_first_order)} / {_pct(r.ettr_renewal)} / "
            f"{_ci(r.mc)} | {_mins(r.young_interval_s)} | {_mins(r.daly_interval_s)} "
            f"| {_pct(r.ettr_renewal_opt)} | {_ci(r.mc_opt)} | {r.gpu_hours_lost_opt:,.0f} |"
        )
    return out


def _target(report: PlanReport) -> list[str]:
    """The downtime budget that reaches the target ETTR, per checkpoint setting."""
    t = report.target
    out = [
        "",
        f"## What it takes: {t.target_ettr:.0%} ETTR on {t.gpus:,} GPUs for {t.days:g} days",
        "",
        "ByteRobust (arXiv:2509.16293) reports 97% ETTR on a 9,600-GPU, three-month job. With "
        f"this table's failure rate that job sees one failure every {t.mttf_hours:.2f} h. "
        "Largest mean downtime per failure that reaches the target at Daly's interval "
        "(bisection, renewal model):",
        "",
        "| checkpoints | delta (s) | load (s) | Daly | ETTR ceiling (zero downtime) "
        "| max downtime/failure | of which detect + recover | this plan's downtime |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in t.rows:
        budget = "unreachable" if row.max_downtime_s is None else f"{row.max_downtime_s:.0f} s"
        dr = (
            "—"
            if row.max_detect_plus_recover_s is None
            else f"{row.max_detect_plus_recover_s:.0f} s"
        )
        out.append(
            f"| {row.label} | {row.checkpoint_write_s:g} | {row.checkpoint_load_s:g} "
            f"| {_mins(row.daly_interval_s)} | {_pct(row.ceiling_ettr)} | {budget} | {dr} "
            f"| {row.current_downtime_s:.0f} s |"
        )
    return out


def _categories(report: PlanReport) -> list[str]:
    """One table row per failure category, with where its times come from."""
    out = [
        "",
        "## Failure categories",
        "",
        "| category | count | share | hardware | detect (s) | recover (s) | source |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in report.categories:
        out.append(
            f"| {c.name} | {c.count} | {_pct(c.share)} | {'yes' if c.hardware else 'no'} "
            f"| {c.detect_s:.0f} | {c.recover_s:.0f} | {c.source} |"
        )
    return out


def write_report(
    report: PlanReport,
    table: FailureTable,
    scenarios: list[Scenario],
    out_dir: Path,
) -> PlanReport:
    """Write ``report.md``, ``report.json``, ``ettr_vs_interval.png``, ``ettr_vs_gpus.png``.

    Returns:
        ``report`` with ``plots`` filled in (file names relative to ``out_dir``).

    Raises:
        PlanError: ``out_dir`` cannot be created or written.
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        interval_png = plot_ettr_vs_interval(
            table,
            report.settings,
            [s for s in scenarios if s.name in ("baseline", "in-memory checkpoints")],
            out_dir / "ettr_vs_interval.png",
        )
        gpus_png = plot_ettr_vs_gpus(
            table, report.settings, scenarios, out_dir / "ettr_vs_gpus.png"
        )
        report = report.model_copy(update={"plots": [interval_png.name, gpus_png.name]})
        (out_dir / "report.json").write_text(report.model_dump_json(indent=2) + "\n")
        (out_dir / "report.md").write_text(render_markdown(report))
    except OSError as exc:
        raise PlanError(f"cannot write the plan report to {out_dir}: {exc}") from exc
    return report


__all__ = ["render_markdown", "write_report"]
