"""The soak's report: what the soak did and every alert that fired meanwhile (Markdown and JSON).

Written by ``stormwatch chaos soak`` to ``<run-dir>/soaks/<soak-id>/soak.json`` and
``soak.md``. :class:`SoakReport` is the file's one model: the soak writes it
(:func:`write_report`), readers load it (:func:`load_report`).

The verdict: ``pass`` when no alert fired in the window and the soak did everything it
plans (the job started, restarted from a checkpoint, shrank and grew back, and ran to the
end); ``fail`` otherwise (``problems`` says what the soak could not do); ``interrupted``
when Ctrl-C or SIGTERM stopped it. Pending-only alerts never fail a soak.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.chaos.reports.files import load_report_file, write_report_files
from stormwatch.chaos.soak.settings import SoakSettings

#: What a soak event is: the job's start and end, and the planned disturbances between.
EventKind = Literal["start", "checkpoint", "eval", "restart", "resize", "end"]
Verdict = Literal["pass", "fail", "interrupted"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SoakEvent(_Model):
    """One thing the soak did or saw the job do, at wall time ``at`` (Unix seconds).

    ``seconds``: how long it lasted, where that was measured (an evaluation pass as the
    phase gauge showed it); ``step``: the training step it concerns (a checkpoint's, the
    step a restarted job resumed from).
    """

    kind: EventKind
    at: float
    detail: str
    seconds: float | None = Field(default=None, ge=0)
    step: int | None = None


class NearEvent(_Model):
    """A soak event near an alert; ``offset_seconds`` = the alert's time - the event's
    (positive: the alert came after the event)."""

    kind: EventKind
    at: float
    detail: str
    offset_seconds: float


class Stretch(_Model):
    """One firing stretch of an alert: first and last firing sample, and the soak event
    nearest its start."""

    first: float
    last: float
    nearest: NearEvent | None = None


class FiredAlert(_Model):
    """An alert (name and labels) that was firing at some evaluation of the window.

    Attributes:
        first_firing / last_firing: its first and last firing sample (Unix seconds).
        firing_seconds: samples firing x the evaluation interval.
        episodes: separate firing stretches (a gap longer than one evaluation splits them).
        stretches: each of them, with the soak event nearest its start.
        firing_at_start: it was firing already at the window's first evaluation.
        nearest: the soak event closest in time to ``first_firing``.
        preceding: the latest soak event at or before ``first_firing`` (its likely cause).
    """

    alertname: str
    labels: dict[str, str]
    first_firing: float
    last_firing: float
    firing_seconds: float = Field(ge=0)
    episodes: int = Field(ge=1)
    stretches: list[Stretch] = Field(default_factory=list)
    firing_at_start: bool = False
    nearest: NearEvent | None = None
    preceding: NearEvent | None = None


class PendingAlert(_Model):
    """An alert that was pending in the window but never fired (informational)."""

    alertname: str
    labels: dict[str, str]
    first_pending: float
    last_pending: float
    nearest: NearEvent | None = None


class SoakReport(BaseModel):
    """A soak run (``soak.json``). Times are Unix seconds.

    Attributes:
        window_start / window_end: the span whose alerts are counted (the soak's start to
            its end plus ``settings.settle_seconds``).
        evaluation_interval_seconds: the step of the range queries (the lab's rule
            evaluation interval).
        world_sizes: the world size of each start of the job's worker group, in order.
        resumed_from: the checkpoint step each start resumed from (``None``: fresh).
        problems: what the soak planned and could not do (each fails it).
    """

    model_config = ConfigDict(extra="forbid")

    soak_id: str
    run_dir: str
    job: str
    settings: SoakSettings
    started_at: float
    ended_at: float | None = None
    window_start: float
    window_end: float | None = None
    evaluation_interval_seconds: float = Field(gt=0)
    events: list[SoakEvent] = Field(default_factory=list)
    world_sizes: list[int] = Field(default_factory=list)
    resumed_from: list[int | None] = Field(default_factory=list)
    fired: list[FiredAlert] = Field(default_factory=list)
    pending_only: list[PendingAlert] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    interrupted: bool = False

    @property
    def verdict(self) -> Verdict:
        if self.interrupted:
            return "interrupted"
        return "fail" if self.fired or self.problems else "pass"

    def of_kind(self, kind: EventKind) -> list[SoakEvent]:
        """The events of ``kind``, in time order."""
        return sorted((e for e in self.events if e.kind == kind), key=lambda e: e.at)


def _utc(at: float | None) -> str:
    if at is None:
        return "—"
    return time.strftime("%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 10)}"


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "—"


def _near(near: NearEvent | None) -> str:
    if near is None:
        return "—"
    return f"{near.kind} ({near.detail}) {near.offset_seconds:+.1f} s"


def _steps(events: list[SoakEvent]) -> str:
    steps = [e.step for e in events if e.step is not None]
    return f" (steps {min(steps)}..{max(steps)})" if steps else ""


def _headline(report: SoakReport) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.started_at))
    minutes = ((report.ended_at or report.started_at) - report.started_at) / 60
    fired = len(report.fired)
    count = f"**{fired} alert{'' if fired == 1 else 's'} fired**"
    return [
        f"# Soak: {report.job}",
        "",
        f"Soak `{report.soak_id}` started {when} against the lab in `{report.run_dir}`, "
        f"{minutes:.1f} min (planned {report.settings.minutes:g}): {count}, "
        f"{len(report.pending_only)} pending only; verdict **{report.verdict}**.",
        f"Alerts counted from {_utc(report.window_start)} to {_utc(report.window_end)} UTC "
        f"(the soak plus {report.settings.settle_seconds:g} s settling), every "
        f"{report.evaluation_interval_seconds:g} s (`ALERTS`, a range query at the rule "
        "evaluation interval); every alert counts, not only the job's.",
        "",
    ]


def _timeline(report: SoakReport) -> list[str]:
    lines = ["## What the soak did", "", "| UTC | t (s) | event | detail |", "|---|---:|---|---|"]
    for event in sorted(report.events, key=lambda e: e.at):
        if event.kind in ("checkpoint", "eval"):
            continue
        offset = event.at - report.started_at
        lines.append(f"| {_utc(event.at)} | {offset:.1f} | {event.kind} | {event.detail} |")
    checkpoints, evals = report.of_kind("checkpoint"), report.of_kind("eval")
    pauses = ", ".join(
        f"{_utc(e.at)} ({e.seconds:.1f} s)" if e.seconds is not None else _utc(e.at) for e in evals
    )
    lines += [
        "",
        f"Checkpoints: {len(checkpoints)}{_steps(checkpoints)}. Evaluation pauses (phase "
        f"`eval`, as Prometheus saw it): {len(evals)}" + (f": {pauses}." if evals else "."),
        f"World size of each start of the workers: {report.world_sizes or '—'}; resumed from "
        f"steps {report.resumed_from or '—'}.",
        "",
    ]
    return lines


def _alerts(report: SoakReport) -> list[str]:
    lines = ["## Alerts that fired", ""]
    if not report.fired:
        lines += ["None.", ""]
    else:
        lines += [
            "| alert | labels | first firing | last firing | firing s (stretches) "
            "| nearest event | latest event before |",
            "|---|---|---|---|---:|---|---|",
        ]
        for a in report.fired:
            first = _utc(a.first_firing) + (" (at start)" if a.firing_at_start else "")
            lines.append(
                f"| {a.alertname} | {_labels(a.labels)} | {first} | {_utc(a.last_firing)} "
                f"| {a.firing_seconds:.0f} ({a.episodes}) | {_near(a.nearest)} "
                f"| {_near(a.preceding)} |"
            )
        lines.append("")
        lines += _stretches(report)
    lines += ["## Pending, never fired (informational)", ""]
    if not report.pending_only:
        return [*lines, "None.", ""]
    lines += ["| alert | labels | first pending | last pending | nearest event |"]
    lines += ["|---|---|---|---|---|"]
    for p in report.pending_only:
        lines.append(
            f"| {p.alertname} | {_labels(p.labels)} | {_utc(p.first_pending)} "
            f"| {_utc(p.last_pending)} | {_near(p.nearest)} |"
        )
    return [*lines, ""]


def _stretches(report: SoakReport) -> list[str]:
    """Each firing stretch of the alerts that fired more than once, with its nearest event."""
    lines = []
    for a in report.fired:
        if len(a.stretches) < 2:
            continue
        lines.append(f"* {a.alertname} ({_labels(a.labels)}) fired {len(a.stretches)} times:")
        lines += [
            f"  * {_utc(s.first)} to {_utc(s.last)}: nearest {_near(s.nearest)}"
            for s in a.stretches
        ]
    return [*lines, ""] if lines else []


def render_markdown(report: SoakReport) -> str:
    """The report as a Markdown document: headline, timeline, alerts, problems."""
    lines = [*_headline(report), *_timeline(report), *_alerts(report)]
    if report.problems:
        lines += ["## Problems", "", *(f"* {p}" for p in report.problems), ""]
    lines += [
        "Times are UTC. An offset is the alert's first firing (or pending) sample minus the "
        'event\'s time: +12.0 s is 12 s after the event. docs/chaos-suite.md, "Soak", says '
        "how to read this report.",
        "",
    ]
    return "\n".join(lines)


def write_report(report: SoakReport, folder: Path) -> tuple[Path, Path]:
    """Write ``soak.json`` and ``soak.md`` into ``folder`` (atomically); returns (md, json)."""
    return write_report_files(folder, "soak", report, render_markdown(report))


def load_report(path: Path) -> SoakReport:
    """Read a ``soak.json``.

    Raises:
        ChaosError: missing, not JSON, or not a soak report (each problem named by its path).
    """
    return load_report_file(
        path, SoakReport, what="a report written by `stormwatch chaos soak`", fix=""
    )


__all__ = [
    "EventKind",
    "FiredAlert",
    "NearEvent",
    "PendingAlert",
    "SoakEvent",
    "SoakReport",
    "Stretch",
    "Verdict",
    "load_report",
    "render_markdown",
    "write_report",
]
