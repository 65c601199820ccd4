"""The experiment journal: one record per activity (start, end, status, output, error).

Written to ``<run-dir>/experiments/<experiment-id>/journal.json`` after every
activity (atomically: temporary file + rename), so a crashed controller still
leaves the journal of what it did. All times are Unix seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

from opentelemetry.trace import Status, StatusCode
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from stormwatch.chaos.errors import ActivityFailed, ChaosError
from stormwatch.chaos.execution.tracing import ExperimentTrace, span_hex
from stormwatch.chaos.ledger.ledger import LedgerEntry

ActivityStatus = Literal["running", "succeeded", "failed", "skipped", "aborted"]
ExperimentStatus = Literal["running", "completed", "deviated", "failed", "aborted"]
Phase = Literal["recovery", "warmup", "before", "method", "after", "rollbacks", "cleanup"]


class ActivityRecord(BaseModel):
    """What one activity did.

    Attributes:
        name: the activity's name from the experiment (or a built-in step's name).
        type: ``action``, ``probe``, ``pause``, ``revert`` or ``wait``.
        phase: where in the experiment it ran.
        status: ``succeeded``, ``failed`` (ran, the condition or fault failed),
            ``skipped`` (not run), ``aborted`` (interrupted), ``running`` (journal
            written mid-activity).
        start / end: Unix seconds.
        output: what it observed or did (JSON).
        error: why it failed, when it did.
        span_id: the activity's OpenTelemetry span (hex) in the journal's ``trace_id``.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    type: str
    phase: Phase
    status: ActivityStatus = "running"
    start: float
    end: float | None = None
    output: JsonValue = None
    error: str | None = None
    span_id: str | None = None

    @property
    def duration(self) -> float | None:
        return None if self.end is None else self.end - self.start


class SteadyState(BaseModel):
    """The hypothesis check of one phase; ``met`` is None when it was not checked."""

    model_config = ConfigDict(extra="forbid")

    met: bool | None = None
    probes: list[ActivityRecord] = Field(default_factory=list)


class JobRef(BaseModel):
    """The training job the experiment ran against."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    log_dir: Path
    world_size: int
    started_by_runner: bool


class Journal(BaseModel):
    """Everything one experiment run did.

    Attributes:
        status: ``completed`` (hypothesis held before and after), ``deviated``
            (it did not hold after), ``failed`` (not held before, or an activity or
            the controller failed), ``aborted`` (interrupted), ``running``.
        rollbacks_ok: every rollback and the final revert of this experiment's
            faults succeeded (None: not run yet).
        faults: this experiment's ledger entries at the end.
        trace_id: the experiment's OpenTelemetry trace (hex; spans in ``spans.jsonl``
            beside the journal, or sent to ``STORMWATCH_OTLP_ENDPOINT``).
    """

    model_config = ConfigDict(extra="forbid")

    experiment_id: str
    title: str
    file: Path
    experiment: JsonValue
    status: ExperimentStatus = "running"
    started_at: float
    ended_at: float | None = None
    job: JobRef | None = None
    recovery: list[ActivityRecord] = Field(default_factory=list)
    warmup: list[ActivityRecord] = Field(default_factory=list)
    steady_state_before: SteadyState = Field(default_factory=SteadyState)
    method: list[ActivityRecord] = Field(default_factory=list)
    steady_state_after: SteadyState = Field(default_factory=SteadyState)
    rollbacks: list[ActivityRecord] = Field(default_factory=list)
    cleanup: list[ActivityRecord] = Field(default_factory=list)
    rollbacks_ok: bool | None = None
    faults: list[LedgerEntry] = Field(default_factory=list)
    error: str | None = None
    trace_id: str | None = None

    @property
    def hypothesis_held(self) -> bool:
        """Held before *and* after the method."""
        return bool(self.steady_state_before.met) and bool(self.steady_state_after.met)

    @property
    def succeeded(self) -> bool:
        """The run's verdict: completed, hypothesis held, rollbacks (and reverts) succeeded."""
        return self.status == "completed" and self.hypothesis_held and self.rollbacks_ok is True


class JournalWriter:
    """Keeps a :class:`Journal` and rewrites ``path`` after every change (once its folder exists).

    :meth:`activity` journals one activity: start on entry; end, status and error on exit;
    with ``trace``, each activity is also a span (child of the experiment's root span)
    whose id the record keeps.
    """

    def __init__(self, journal: Journal, path: Path, trace: ExperimentTrace | None = None) -> None:
        self.journal = journal
        self.path = path
        self.trace = trace
        if trace is not None:
            journal.trace_id = trace.trace_id

    def save(self) -> None:
        """Write the journal (no-op until the experiment folder exists)."""
        if self.path.parent.exists():
            write_journal(self.journal, self.path)

    def section(self, phase: Phase) -> list[ActivityRecord]:
        """The list of records of ``phase``."""
        j = self.journal
        sections: dict[str, list[ActivityRecord]] = {
            "recovery": j.recovery,
            "warmup": j.warmup,
            "before": j.steady_state_before.probes,
            "method": j.method,
            "after": j.steady_state_after.probes,
            "rollbacks": j.rollbacks,
            "cleanup": j.cleanup,
        }
        return sections[phase]

    @contextlib.asynccontextmanager
    async def activity(
        self, name: str, type_: str, phase: Phase, *, raise_on_failure: bool = True
    ) -> AsyncIterator[ActivityRecord]:
        """Journal the ``async with`` body as one activity.

        The body may set ``output`` (and ``status="failed"`` with ``error``). A
        :class:`ChaosError` marks it failed and is re-raised as :class:`ActivityFailed`
        (or swallowed with ``raise_on_failure=False``); cancellation marks it aborted.
        """
        record = ActivityRecord(name=name, type=type_, phase=phase, start=time.time())
        span = None
        if self.trace is not None:
            span = self.trace.tracer.start_span(
                f"{phase} {type_} {name}",
                context=self.trace.context,
                attributes={"activity.name": name, "activity.type": type_, "phase": phase},
            )
            record.span_id = span_hex(span)
        self.section(phase).append(record)
        self.save()
        try:
            yield record
        except asyncio.CancelledError:
            record.status, record.error = "aborted", "interrupted"
            raise
        except ChaosError as exc:
            record.status, record.error = "failed", str(exc)
            if raise_on_failure:
                raise ActivityFailed(f"{name}: {exc}") from exc
        except Exception as exc:
            record.status, record.error = "failed", f"unexpected {type(exc).__name__}: {exc}"
            raise
        else:
            if record.status == "running":
                record.status = "succeeded"
        finally:
            record.end = time.time()
            if span is not None:
                span.set_attribute("activity.status", record.status)
                if record.error:
                    span.set_status(Status(StatusCode.ERROR, record.error))
                span.end()
            self.save()

    def skipped(self, name: str, type_: str, phase: Phase, why: str) -> None:
        """Journal an activity that did not run, and why."""
        now = time.time()
        output: JsonValue = {"reason": why}
        self.section(phase).append(
            ActivityRecord(
                name=name,
                type=type_,
                phase=phase,
                status="skipped",
                start=now,
                end=now,
                output=output,
            )
        )
        self.save()


def write_journal(journal: Journal, path: Path) -> None:
    """Write ``journal`` to ``path`` atomically (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(journal.model_dump_json(indent=2), encoding="utf-8")
    os.replace(tmp, path)


def load_journal(path: Path) -> Journal:
    """Read a journal written by :func:`write_journal` (pydantic errors propagate)."""
    return Journal.model_validate_json(Path(path).read_text(encoding="utf-8"))


__all__ = [
    "ActivityRecord",
    "ActivityStatus",
    "ExperimentStatus",
    "JobRef",
    "Journal",
    "JournalWriter",
    "Phase",
    "SteadyState",
    "load_journal",
    "write_journal",
]
