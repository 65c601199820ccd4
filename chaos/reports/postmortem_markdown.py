"""The experiment post-mortem as Markdown (``postmortem.md``); the analysis is in
:mod:`stormwatch.chaos.reports.postmortem`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stormwatch.chaos.reports.postmortem import PostMortem


def alert_name(pm: PostMortem) -> str:
    """``Name{job=..., rank=..., severity=...}`` of the post-mortem's alert ("" when none)."""
    if pm.alertname is None:
        return ""
    keys = ("job", "rank", "severity")
    labels = ", ".join(f"{k}={pm.alert_labels[k]}" for k in keys if k in pm.alert_labels)
    return f"{pm.alertname}{{{labels}}}" if labels else pm.alertname


def format_clock(at: float | None) -> str:
    """Local wall-clock time ``HH:MM:SS.mmm`` of Unix time ``at`` ("—" for None)."""
    if at is None:
        return "—"
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int((at % 1) * 1000):03d}"


def _secs(value: float | None, missing: str) -> str:
    return missing if value is None else f"{value:.1f} s"


def _recovery_event(pm: PostMortem) -> str:
    if pm.recovered_by == "fault removed":
        return "every rank stepping after the fault's removal"
    return "first step after resume"


def render_markdown(pm: PostMortem) -> str:
    """The post-mortem as Markdown (what ``postmortem.md`` holds)."""

    def yes_no(v: bool | None) -> str:
        return "n/a" if v is None else ("yes" if v else "**no**")

    loss = pm.loss
    lines = [
        f"# Post-mortem: {pm.title}",
        "",
        f"Experiment `{pm.experiment_id}` on job `{pm.job or '—'}`: status **{pm.status}**; "
        f"steady-state hypothesis held: {yes_no(pm.hypothesis_held)}; "
        f"rollbacks succeeded: {yes_no(pm.rollbacks_ok)}.",
        "",
        "## Summary",
        "",
        "| measure | value |",
        "|---|---|",
        f"| fault | {pm.fault_kind or '—'} rank {pm.fault_rank if pm.fault_rank is not None else '—'}"
        f" on {pm.fault_node or '—'} at {format_clock(pm.fault_at)} |",
        f"| alert | {alert_name(pm) or 'none'} |",
        f"| time to detect (fault → alert firing) | "
        f"{_secs(pm.time_to_detect_seconds, 'not detected')} |",
        f"| time to recover (fault → {_recovery_event(pm)}) | "
        f"{_secs(pm.time_to_recover_seconds, 'not recovered')} |",
        f"| last step before the fault | {_opt(pm.last_step_before_fault)} |",
        f"| resumed from step | {_opt(pm.resumed_from_step)} |",
        f"| steps lost | {_opt(pm.steps_lost)} |",
        f"| loss identical to baseline after recovery | {yes_no(loss.identical)} "
        f"({loss.compared_steps} steps compared"
        + (f" from step {loss.from_step}" if loss.from_step is not None else "")
        + (f", baseline `{loss.baseline}`" if loss.baseline else "")
        + ") |",
        "",
        "## Timeline",
        "",
        "| time | since fault | event | source | detail |",
        "|---|---|---|---|---|",
    ]
    for event in pm.timeline:
        since = (
            "" if event.at is None or pm.fault_at is None else f"{event.at - pm.fault_at:+.1f} s"
        )
        at = format_clock(event.at) if event.at is not None else "not observed"
        lines.append(f"| {at} | {since} | {event.event} | {event.source} | {event.detail} |")
    lines += ["", "## Loss after recovery", ""]
    if pm.loss_plot:
        lines += [f"![loss per step, experiment vs baseline]({pm.loss_plot})", ""]
    if loss.identical is None:
        lines.append(f"Not compared: {loss.note}")
    elif loss.identical:
        lines.append(
            f"Bitwise identical to the baseline at all {loss.compared_steps} steps "
            f"from step {loss.from_step} (`loss_hex`, rank 0)."
        )
    else:
        lines += [
            f"**{len(loss.mismatches)} of {loss.compared_steps} steps differ** from the baseline:",
            "",
            "| step | baseline | experiment |",
            "|---|---|---|",
        ]
        lines += [
            f"| {m.step} | `{m.baseline_hex}` | `{m.experiment_hex}` |" for m in loss.mismatches
        ]
    if loss.missing_in_baseline:
        lines += [
            "",
            "Steps missing from the baseline: "
            + ", ".join(str(s) for s in loss.missing_in_baseline),
        ]
    lines += ["", "## Faults", ""]
    if pm.faults_left_open:
        lines += [f"- **still open**: {f}" for f in pm.faults_left_open]
    else:
        lines.append("Every fault of this experiment is reverted in the ledger.")
    if pm.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in pm.notes]
    return "\n".join(lines) + "\n"


def _opt(value: int | None) -> str:
    return "—" if value is None else str(value)


__all__ = ["alert_name", "format_clock", "render_markdown"]
