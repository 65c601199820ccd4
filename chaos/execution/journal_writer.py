"""Journaling a running experiment: :class:`JournalWriter` keeps the :class:`Journal`
(the file's model, :mod:`stormwatch.contracts.journal`), rewrites the file after
every change and makes each activity an OpenTelemetry span."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from opentelemetry.trace import Status, StatusCode
from pydantic import JsonValue

from stormwatch.chaos.errors import ActivityFailed, ChaosError
from stormwatch.chaos.execution.tracing import ExperimentTrace, span_hex
from stormwatch.contracts.journal import ActivityRecord, Journal, Phase, write_journal


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
        return self.journal.section(phase)

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


__all__ = ["JournalWriter"]
