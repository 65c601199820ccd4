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

import time
from pathlib import Path
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stormwatch.chaos.errors import ChaosError
from stormwatch.contracts.journal import ExperimentStatus

Verdict = Literal["pass", "fail", "not run"]
#: An experiment's journal status, or ``not run`` (the suite stopped before it).
RowStatus: TypeAlias = ExperimentStatus | Literal["not run"]


class ScorecardRow(BaseModel):
    """One experiment of a suite. Times in seconds; ``None``: not observed / not run."""

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
    rows: list[ScorecardRow] = Field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(r.verdict == "pass" for r in self.rows)

    @property
    def ok(self) -> bool:
        """Every experiment ran and passed."""
        return not self.interrupted and all(r.verdict == "pass" for r in self.rows)


def _yes(value: bool | None) -> str:
    return "—" if value is None else ("yes" if value else "**no**")


def _by(recovered_by: str | None) -> str:
    """The recovery kind's one-letter mark after the time (``r`` restart, ``f`` fault removed)."""
    return {"restart": " (r)", "fault removed": " (f)"}.get(recovered_by or "", "")


def _secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


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
        "| experiment | fault | category | detected | by alert | detect s | recover s "
        "| steps lost | loss | checkpoint | faults cleared | verdict |",
        "|---|---|---|---|---|---:|---:|---:|---|---|---|---|",
    ]
    for r in card.rows:
        lines.append(
            f"| {Path(r.file).name} | {r.fault or '—'} | {r.category or '—'} | {_yes(r.detected)} "
            f"| {r.alert or '—'} | {_secs(r.time_to_detect_seconds)} "
            f"| {_secs(r.time_to_recover_seconds)}{_by(r.recovered_by)} "
            f"| {'—' if r.steps_lost is None else r.steps_lost} | {_yes(r.loss)} "
            f"| {_yes(r.checkpoint)} | {_yes(r.faults_cleared)} | **{r.verdict}** |"
        )
    failed = [r for r in card.rows if r.reasons]
    if failed:
        lines += ["", "## Why", ""]
        for r in failed:
            lines.append(f"* `{Path(r.file).name}` ({r.verdict}): " + "; ".join(r.reasons))
    if card.baselines:
        lines += ["", "Baselines (fault-free, for the loss check): "]
        lines += [f"* seed {seed}: job `{job}`" for seed, job in sorted(card.baselines.items())]
    lines += [
        "",
        "Definitions: time to detect = fault -> first firing sample of an alert about the job; "
        "time to recover = fault -> first step of a restarted worker (r: restart), or, when the "
        "job did not restart, fault -> every rank stepped after the fault was removed "
        "(f: fault removed); steps lost = last step before the fault - step resumed from "
        "(docs/chaos-suite.md).",
        "",
    ]
    return "\n".join(lines)


def write_scorecard(card: Scorecard, folder: Path) -> tuple[Path, Path]:
    """Write ``scorecard.json`` and ``scorecard.md`` into ``folder``; returns (md, json)."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / "scorecard.json", folder / "scorecard.md"
    for path, text in (
        (json_path, card.model_dump_json(indent=2)),
        (md_path, render_markdown(card)),
    ):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return md_path, json_path


def load_scorecard(path: Path) -> Scorecard:
    """Read a ``scorecard.json``.

    Raises:
        ChaosError: missing, not JSON, or not a scorecard (an unknown key, a negative
            time or step count; each problem named by its path, e.g. ``rows.0.category``).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChaosError(f"{path}: cannot read the scorecard: {exc}") from exc
    try:
        return Scorecard.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or 'file'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ChaosError(
            f"{path}: not a scorecard written by `stormwatch chaos suite` ({problems}); give "
            "a RUN_DIR/suites/<suite-id>/scorecard.json, or rerun the suite"
        ) from exc


def latest_scorecard(run_dir: Path) -> Path | None:
    """The newest ``<run_dir>/suites/*/scorecard.json`` (suite ids sort by start time)."""
    found = sorted(Path(run_dir).glob("suites/*/scorecard.json"))
    return found[-1] if found else None


__all__ = [
    "RowStatus",
    "Scorecard",
    "ScorecardRow",
    "Verdict",
    "latest_scorecard",
    "load_scorecard",
    "render_markdown",
    "write_scorecard",
]
