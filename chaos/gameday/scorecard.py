"""The game-day scorecard: one row per experiment of a suite (Markdown and JSON).

Written by ``stormwatch chaos suite`` to ``<run-dir>/suites/<suite-id>/scorecard.json``
and ``scorecard.md`` (rewritten after every experiment, so an interrupted suite
still leaves one). :class:`Scorecard` is the file's one model: the suite writes it
(:func:`write_scorecard`), every reader loads it (:func:`load_scorecard`;
``stormwatch plan`` reads the latest one, :func:`latest_scorecard`, for per-category
detect and recover times).

Per row: the fault, whether it was detected and by which alert, time to detect and
to recover (definitions in :mod:`stormwatch.chaos.reports.experiment_report`), steps lost, the
three checks of :mod:`stormwatch.chaos.reports.verify`, and the verdict:

* ``pass``: the hypothesis held before and after, every rollback and revert
  succeeded, the fault was detected when ``expect.detect`` (by one of
  ``expect.alerts`` when given), and no verification failed;
* ``fail``: otherwise (``reasons`` lists why);
* ``not run``: the suite was interrupted before it.

Per row also, against issue 18's detection targets: the fault's detection class and its
target (:mod:`stormwatch.chaos.gameday.targets`), whether the detect time was within
it, what the detecting alert named (its culprit) and whether that was the fault's
place, and the false alarms that fired during the experiment (definitions in
:mod:`stormwatch.chaos.gameday.culprits`). They fail a row (a reason each) only where
the targets are enforced: ``stormwatch chaos suite --strict-targets``, or an experiment
file's ``expect.strict_targets: true``; otherwise they are reported, and the verdict is
the one above. Rows of a scorecard written before these columns load with them empty.

Fault kind -> failure category (Llama 3 Table 5 ids, ``plan/llama3_table5.yaml``),
used when an experiment does not set ``expect.category``: each kind's
:attr:`stormwatch.faults.Traits.category` (:data:`stormwatch.faults.FAULT_CATEGORIES`;
docs/faults.md says why each kind models its category). Kinds that do not interrupt a
job (``kill_agent``: monitoring only; ``trainer_fault`` slowdowns, ``cpu_throttle``,
``bandwidth_limit``, ``packet_drop``, GPU throttling and NVLink error bursts) have no
default category: their rows are not used by the planner unless the file sets
``expect.category`` (a ``trainer_fault`` with ``point: collective_hang`` should say
``nccl_watchdog_timeouts``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.chaos.reports.files import load_report_file, write_report_files
from stormwatch.contracts.journal import ExperimentStatus

Verdict = Literal["pass", "fail", "not run"]
#: An experiment's journal status, or ``not run`` (the suite stopped before it).
RowStatus: TypeAlias = ExperimentStatus | Literal["not run"]


class FiredAlert(BaseModel):
    """An alert that fired during an experiment (``labels`` without ``alertname``)."""

    model_config = ConfigDict(extra="forbid")

    alertname: str
    labels: dict[str, str] = Field(default_factory=dict)
    firing_at: float | None = None

    def __str__(self) -> str:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        return f"{self.alertname}{{{inner}}}"


class ScorecardRow(BaseModel):
    """One experiment of a suite. Times in seconds; ``None``: not observed / not run.

    The detection-target fields (None / empty in scorecards written before them):
    ``detect_class`` (the fault's :class:`~stormwatch.faults.DetectClass`),
    ``target_seconds`` (its target for this run), ``within_target`` (detected no later),
    ``culprit`` (the detecting alert's ``rank``/``node``/``gpu``/``link`` labels),
    ``culprit_correct``, ``false_alarms`` (None: not judged) and ``targets_enforced``
    (they counted toward the verdict).
    """

    model_config = ConfigDict(extra="forbid")

    file: str
    title: str
    experiment_id: str | None = None
    fault: str = ""
    fault_kind: str | None = None
    category: str | None = None
    status: RowStatus = "not run"
    detected: bool | None = None
    alert: str | None = None
    time_to_detect_seconds: float | None = Field(default=None, ge=0)
    detect_class: str | None = None
    target_seconds: float | None = Field(default=None, ge=0)
    within_target: bool | None = None
    culprit: dict[str, str] = Field(default_factory=dict)
    culprit_correct: bool | None = None
    false_alarms: list[FiredAlert] | None = None
    targets_enforced: bool = False
    recovered: bool | None = None
    recovered_by: Literal["restart", "fault removed"] | None = None
    time_to_recover_seconds: float | None = Field(default=None, ge=0)
    steps_lost: int | None = Field(default=None, ge=0)
    loss: bool | None = None
    checkpoint: bool | None = None
    faults_cleared: bool | None = None
    verdict: Verdict = "not run"
    reasons: list[str] = Field(default_factory=list)
    experiment_dir: str | None = None


class Scorecard(BaseModel):
    """A suite run (``scorecard.json``)."""

    model_config = ConfigDict(extra="forbid")

    suite_id: str
    suite_dir: str
    run_dir: str
    started_at: float
    ended_at: float | None = None
    interrupted: bool = False
    baselines: dict[str, str] = Field(default_factory=dict)
    strict_targets: bool = False
    rows: list[ScorecardRow] = Field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(r.verdict == "pass" for r in self.rows)

    @property
    def ok(self) -> bool:
        """Every experiment ran and passed."""
        return not self.interrupted and all(r.verdict == "pass" for r in self.rows)

    def target_summary(self) -> TargetSummary:
        """How the rows did against the detection targets (see :class:`TargetSummary`)."""
        judged = [r for r in self.rows if r.within_target is not None and r.detect_class]
        by_class: dict[str, list[bool]] = {}
        for r in judged:
            by_class.setdefault(r.detect_class or "", []).append(bool(r.within_target))
        culprits = [r.culprit_correct for r in self.rows if r.culprit_correct is not None]
        return TargetSummary(
            classes_within=sum(all(v) for v in by_class.values()),
            classes=len(by_class),
            rows_within=sum(bool(r.within_target) for r in judged),
            rows=len(judged),
            culprits_correct=sum(culprits),
            culprits=len(culprits),
            false_alarms=sum(len(r.false_alarms or []) for r in self.rows),
        )


@dataclasses.dataclass(frozen=True)
class TargetSummary:
    """The scorecard's detection-target totals.

    Attributes:
        classes_within / classes: detection classes whose every judged row was within its
            target, of the classes with a judged row (a row is judged when its class has a
            target and a fault was injected).
        rows_within / rows: the same, counted by row.
        culprits_correct / culprits: rows whose detecting alert named the fault, of the
            rows where that was judged.
        false_alarms: false alarms of every row.
    """

    classes_within: int
    classes: int
    rows_within: int
    rows: int
    culprits_correct: int
    culprits: int
    false_alarms: int


def _yes(value: bool | None) -> str:
    return "—" if value is None else ("yes" if value else "**no**")


def _by(recovered_by: str | None) -> str:
    """The recovery kind's one-letter mark after the time (``r`` restart, ``f`` fault removed)."""
    return {"restart": " (r)", "fault removed": " (f)"}.get(recovered_by or "", "")


def _secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _culprit(culprit: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in culprit.items()) or "—"


def _count(alerts: list[FiredAlert] | None) -> str:
    return "—" if alerts is None else (f"**{len(alerts)}**" if alerts else "0")


def render_markdown(card: Scorecard) -> str:
    """The scorecard as a Markdown document (one table, then the reasons of failures)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(card.started_at))
    lines = [
        f"# Game day scorecard: {Path(card.suite_dir).name}",
        "",
        f"Suite `{card.suite_dir}`, run `{card.suite_id}` started {when} against the lab in "
        f"`{card.run_dir}`: **{card.passed}/{len(card.rows)} passed**"
        + (" (interrupted)" if card.interrupted else "")
        + ".",
        "",
        "| experiment | fault | category | class | detected | by alert | detect s | target s "
        "| in target | culprit | culprit ok | false alarms | recover s "
        "| steps lost | loss | checkpoint | faults cleared | verdict |",
        "|---|---|---|---|---|---|---:|---:|---|---|---|---:|---:|---:|---|---|---|---|",
    ]
    for r in card.rows:
        lines.append(
            f"| {Path(r.file).name} | {r.fault or '—'} | {r.category or '—'} "
            f"| {r.detect_class or '—'} | {_yes(r.detected)} "
            f"| {r.alert or '—'} | {_secs(r.time_to_detect_seconds)} "
            f"| {_secs(r.target_seconds)} | {_yes(r.within_target)} | {_culprit(r.culprit)} "
            f"| {_yes(r.culprit_correct)} | {_count(r.false_alarms)} "
            f"| {_secs(r.time_to_recover_seconds)}{_by(r.recovered_by)} "
            f"| {'—' if r.steps_lost is None else r.steps_lost} | {_yes(r.loss)} "
            f"| {_yes(r.checkpoint)} | {_yes(r.faults_cleared)} | **{r.verdict}** |"
        )
    failed = [r for r in card.rows if r.reasons]
    if failed:
        lines += ["", "## Why", ""]
        for r in failed:
            lines.append(f"* `{Path(r.file).name}` ({r.verdict}): " + "; ".join(r.reasons))
    alarmed = [r for r in card.rows if r.false_alarms]
    if alarmed:
        lines += ["", "## False alarms", ""]
        for r in alarmed:
            names = ", ".join(f"`{a}`" for a in r.false_alarms or [])
            lines.append(f"* `{Path(r.file).name}`: {names}")
    if card.baselines:
        lines += ["", "Baselines (fault-free, for the loss check): "]
        lines += [f"* seed {seed}: job `{job}`" for seed, job in sorted(card.baselines.items())]
    lines += [
        "",
        "Definitions: time to detect = fault -> first firing sample of an alert about the job; "
        "time to recover = fault -> first step of a restarted worker (r: restart), or, when the "
        "job did not restart, fault -> every rank stepped after the fault was removed "
        "(f: fault removed); steps lost = last step before the fault - step resumed from; "
        "target s = the fault's detection class's target (issue 18); culprit = the detecting "
        "alert's rank/node/gpu/link labels, ok when they name the faulted place; false "
        "alarms = alerts fired during the experiment neither expected nor caused by the "
        "fault (docs/chaos-suite.md).",
        "",
    ]
    totals = card.target_summary()
    strict = [Path(r.file).name for r in card.rows if r.targets_enforced]
    enforced = (
        "they count toward every verdict: --strict-targets"
        if card.strict_targets
        else f"they count toward the verdict of {', '.join(strict)} (expect.strict_targets) "
        "and are reported for the others"
        if strict
        else "reported; they do not count toward the verdict"
    )
    lines += [
        f"Detection targets ({enforced}):",
        "",
        f"* classes within target: {totals.classes_within} of {totals.classes} "
        f"(rows: {totals.rows_within} of {totals.rows})",
        f"* culprit correct: {totals.culprits_correct} of {totals.culprits}",
        f"* false alarms: {totals.false_alarms}",
        "",
    ]
    return "\n".join(lines)


def write_scorecard(card: Scorecard, folder: Path) -> tuple[Path, Path]:
    """Write ``scorecard.json`` and ``scorecard.md`` into ``folder``; returns (md, json)."""
    return write_report_files(folder, "scorecard", card, render_markdown(card))


def load_scorecard(path: Path) -> Scorecard:
    """Read a ``scorecard.json``.

    Raises:
        ChaosError: missing, not JSON, or not a scorecard (an unknown key, a negative
            time or step count; each problem named by its path, e.g. ``rows.0.category``).
    """
    return load_report_file(
        path,
        Scorecard,
        what="a scorecard written by `stormwatch chaos suite`",
        fix="; give a RUN_DIR/suites/<suite-id>/scorecard.json, or rerun the suite",
    )


def latest_scorecard(run_dir: Path) -> Path | None:
    """The newest ``<run_dir>/suites/*/scorecard.json`` (suite ids sort by start time)."""
    found = sorted(Path(run_dir).glob("suites/*/scorecard.json"))
    return found[-1] if found else None


__all__ = [
    "FiredAlert",
    "RowStatus",
    "Scorecard",
    "ScorecardRow",
    "TargetSummary",
    "Verdict",
    "latest_scorecard",
    "load_scorecard",
    "render_markdown",
    "write_scorecard",
]
