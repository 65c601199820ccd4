"""Per-rank JSON-lines event log, ``<log-dir>/rank<R>.jsonl`` (docs/ARCHITECTURE.md).

The one declaration of the file's records (:data:`RankEvent`, a union
discriminated by ``event``), the writer (:class:`EventLog`) and the line
parser every reader uses (:func:`parse_events`, :func:`read_events`; the
job-level view is :mod:`stormwatch.telemetry.ranklogs`).

Records, one JSON object per line, appended with their keys in this order (a step
record, with ``deferred=True``, is queued on the training thread and encoded and
written by the rank's flusher thread within 0.1 s, :mod:`stormwatch.telemetry.handoff.flusher`;
every other record is written at once, after the queued ones, so the order holds):

* ``{"event": "start", "time", "rank", "attempt", "resumed_from_step", "pid", "world_size",
  "job_attempt", "restarted_by"}``
* ``{"event": "step", "time", "step", "loss", "loss_hex", "attempt", "step_seconds"}``
* ``{"event": "checkpoint", "time", "step", "attempt"}``
* ``{"event": "checkpoint_failed", "time", "step", "attempt", "error"}``: the save
  after ``step`` failed on some rank (every rank writes it); training went on
* ``{"event": "done", "time", "step", "attempt"}``
* ``{"event": "fault", "time", "point", "step", "attempt"}``: a chaos fault
  point (:mod:`stormwatch.trainer.control`) took effect in ``step`` (once
  per point and step; only written when faults are armed)

``time`` is Unix seconds (float); ``attempt`` is TORCHELASTIC_RESTART_COUNT;
``loss`` is the global mean loss and ``loss_hex`` its ``float.hex`` for
bitwise comparison; every line is strict JSON (jq, ``JSON.parse``): a non-finite loss is
written as ``"loss": null`` with ``loss_hex`` ``"nan"``, ``"inf"`` or ``"-inf"``, and
read back as that float (lines from older writers with a bare ``NaN`` still parse);
``job_attempt`` (left out when not agreed) is the job-wide restart count every rank
agreed at start-up and ``restarted_by`` the nodes whose own workers failed before it
(:mod:`stormwatch.telemetry.restarts`; ``attempt`` is node-local);
``resumed_from_step`` is ``null`` on a fresh start; ``pid`` (an addition to
the contract) lets a reader map a rank to the process whose metric files it
wrote; ``world_size`` (another, left out when unknown) is the size of the
rendezvous this start belongs to, which an elastic job changes. Restarts
append to the same file, so a step can appear once per attempt.

Reading is tolerant, as readers always were: keys the trainer may add later
are ignored, every key but ``event`` and ``time`` has a default (stand-in
workloads and older trainers write fewer), and a line that is not a record
(the torn last line of a SIGKILLed writer, a malformed line) is skipped and
counted, never fatal. No torch import here (a test checks it).
"""

from __future__ import annotations

import collections
import json
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ClassVar, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator


class _Record(BaseModel):
    """Shared settings of the records (no fields: each record lists its keys in file order)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    #: Keys left out of the line when their value is ``None`` (contract additions).
    omitted_when_none: ClassVar[frozenset[str]] = frozenset()

    def to_line(self) -> str:
        """The record as one JSON line, without the newline (keys in declaration order)."""
        record = self.model_dump()
        for key in self.omitted_when_none:
            if record.get(key) is None:
                record.pop(key, None)
        for key, value in record.items():  # strict JSON: a record keeps the exact value apart
            if isinstance(value, float) and not math.isfinite(value):
                record[key] = None
        return json.dumps(record, allow_nan=False)


class StartEvent(_Record):
    """The rank is ready to train (after any resume)."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset(
        {"world_size", "job_attempt", "restarted_by"}
    )

    event: Literal["start"] = "start"
    time: float
    rank: int | None = None
    attempt: int = 0
    resumed_from_step: int | None = None
    pid: int | None = None
    world_size: int | None = None
    job_attempt: int | None = None
    restarted_by: list[str] | None = None


class StepEvent(_Record):
    """One completed step with its global mean loss (``step_seconds``: its wall time)."""

    event: Literal["step"] = "step"
    time: float
    step: int | None = None
    loss: float | None = None
    loss_hex: str | None = None
    attempt: int = 0
    step_seconds: float | None = None

    @model_validator(mode="after")
    def _non_finite_loss(self) -> StepEvent:
        """A ``null`` loss with a ``loss_hex`` is the non-finite loss it spells."""
        if self.loss is None and self.loss_hex is not None:
            try:
                value = float.fromhex(self.loss_hex)
            except ValueError:  # not a float's hex: the loss stays unknown
                return self
            if not math.isfinite(value):
                object.__setattr__(self, "loss", value)
        return self


class CheckpointEvent(_Record):
    """A checkpoint of ``step`` is complete (renamed into place)."""

    event: Literal["checkpoint"] = "checkpoint"
    time: float
    step: int | None = None
    attempt: int = 0


class CheckpointFailedEvent(_Record):
    """The save after ``step`` failed (``error``: why, from every rank that failed)."""

    event: Literal["checkpoint_failed"] = "checkpoint_failed"
    time: float
    step: int | None = None
    attempt: int = 0
    error: str | None = None


class DoneEvent(_Record):
    """Training finished cleanly after ``step``."""

    event: Literal["done"] = "done"
    time: float
    step: int | None = None
    attempt: int = 0


class FaultEvent(_Record):
    """Fault point ``point`` took effect during ``step``."""

    event: Literal["fault"] = "fault"
    time: float
    point: str | None = None
    step: int | None = None
    attempt: int = 0


#: One line of a rank log, by its ``event``.
RankEvent = Annotated[
    StartEvent | StepEvent | CheckpointEvent | CheckpointFailedEvent | DoneEvent | FaultEvent,
    Field(discriminator="event"),
]
_RANK_EVENT: TypeAdapter[RankEvent] = TypeAdapter(RankEvent)


#: Step records queued for the writer at most (a minute of 6 ms steps, ~2 MB); beyond,
#: a step record is dropped and counted (:attr:`EventLog.dropped`): a stuck writer must
#: not grow the rank's memory without bound.
MAX_PENDING = 10_000


def log_path(log_dir: Path, rank: int) -> Path:
    """``<log_dir>/rank<rank>.jsonl``."""
    return log_dir / f"rank{rank}.jsonl"


def parse_event(line: str) -> RankEvent:
    """One line as its record.

    Raises:
        ValueError: (pydantic's ``ValidationError``) not JSON, an unknown ``event``,
            no ``time``, or a wrongly typed key.
    """
    return _RANK_EVENT.validate_json(line)


def parse_events(text: str) -> tuple[list[RankEvent], int]:
    """The records of a log's text, in file order, and how many non-blank lines were skipped."""
    events: list[RankEvent] = []
    skipped = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            events.append(parse_event(line))
        except ValidationError:
            skipped += 1
    return events, skipped


def read_events(path: Path) -> list[RankEvent]:
    """Parse a ``rank<R>.jsonl`` file, skipping a torn last line (after a SIGKILL).

    Raises:
        OSError: the file cannot be read (a missing file included).
    """
    events, _ = parse_events(path.read_text(encoding="utf-8", errors="replace"))
    return events


class EventLog:
    """Appends event records for one rank.

    Args:
        log_dir: folder (created if missing).
        rank: global rank.
        attempt: torchrun restart count, copied into every record.
        clock: Unix time source (default :func:`time.time`).
        world_size: ranks of this incarnation's rendezvous (written in ``start``; None: left out).
        deferred: queue step records in memory (at most :data:`MAX_PENDING`) for
            :meth:`flush` on another thread; ``False``: every record is written at once.

    Raises:
        OSError: the file cannot be opened (callers treat this as a telemetry failure).
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        rank: int,
        attempt: int,
        clock: Callable[[], float],
        world_size: int | None = None,
        deferred: bool = False,
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_path(log_dir, rank)
        self._rank = rank
        self._attempt = attempt
        self._world_size = world_size
        self._clock = clock
        self._job_attempt: int | None = None
        self._restarted_by: list[str] | None = None
        self.deferred = deferred
        #: Step records dropped because the queue was full (never reset).
        self.dropped = 0
        # (time, step, loss, step_seconds) of the step records not yet written
        self._queue: collections.deque[tuple[float, int, float | None, float]] = collections.deque()
        self._lock = threading.Lock()  # the file: queued lines and direct records in order
        self._file: TextIO = self.path.open("a", encoding="utf-8")

    def _queued_lines(self) -> list[str]:
        """Encode and take the queued step records (under ``_lock``)."""
        lines = []
        queue = self._queue
        while queue:
            at, step, loss, seconds = queue.popleft()
            record = StepEvent(
                time=at,
                step=step,
                loss=loss,
                loss_hex=None if loss is None else float.hex(loss),
                attempt=self._attempt,
                step_seconds=seconds,
            )
            lines.append(record.to_line() + "\n")
        return lines

    def _write(self, record: _Record | None) -> None:
        # Whole lines per write(): a SIGKILL can cut the log between records, not inside one.
        with self._lock:
            lines = self._queued_lines()
            if record is not None:
                lines.append(record.to_line() + "\n")
            if lines:
                self._file.write("".join(lines))
                self._file.flush()

    def flush(self) -> None:
        """Write the queued step records (the flusher's call; any thread).

        Raises:
            OSError: the write failed (the records taken are lost, not retried).
        """
        if self._queue:
            self._write(None)

    def start(self, *, resumed_from_step: int | None) -> None:
        """The rank is ready to train (after any resume)."""
        self._write(
            StartEvent(
                time=self._clock(),
                rank=self._rank,
                attempt=self._attempt,
                resumed_from_step=resumed_from_step,
                pid=os.getpid(),
                world_size=self._world_size,
                job_attempt=self._job_attempt,
                restarted_by=self._restarted_by,
            )
        )

    def job_attempt(self, attempt: int, *, failed_nodes: tuple[str, ...] = ()) -> None:
        """The agreed job attempt and the nodes that failed before it, for the start record."""
        self._job_attempt = attempt
        self._restarted_by = list(failed_nodes) if attempt > 0 else None

    def step(self, *, step: int, loss: float | None, step_seconds: float) -> None:
        """One completed step with its global mean loss (``None``: not reported); queued
        when deferred (dropped and counted in :attr:`dropped` when the queue is full)."""
        if self.deferred:
            if len(self._queue) >= MAX_PENDING:
                self.dropped += 1
                return
            self._queue.append((self._clock(), step, loss, step_seconds))
            return
        self._write(
            StepEvent(
                time=self._clock(),
                step=step,
                loss=loss,
                loss_hex=None if loss is None else float.hex(loss),
                attempt=self._attempt,
                step_seconds=step_seconds,
            )
        )

    def checkpoint(self, *, step: int) -> None:
        """A checkpoint of ``step`` is complete (renamed into place)."""
        self._write(CheckpointEvent(time=self._clock(), step=step, attempt=self._attempt))

    def checkpoint_failed(self, *, step: int, error: str) -> None:
        """The save after ``step`` failed (``error``: why, from every rank that failed)."""
        self._write(
            CheckpointFailedEvent(time=self._clock(), step=step, attempt=self._attempt, error=error)
        )

    def done(self, *, step: int | None) -> None:
        """Training finished cleanly after ``step``."""
        self._write(DoneEvent(time=self._clock(), step=step, attempt=self._attempt))

    def fault(self, *, point: str, step: int) -> None:
        """Fault point ``point`` took effect during ``step``."""
        self._write(FaultEvent(time=self._clock(), point=point, step=step, attempt=self._attempt))

    def close(self) -> None:
        """Write the queued records and close the file (idempotent)."""
        if not self._file.closed:
            self.flush()
        self._file.close()


__all__ = [
    "MAX_PENDING",
    "CheckpointEvent",
    "CheckpointFailedEvent",
    "DoneEvent",
    "EventLog",
    "FaultEvent",
    "RankEvent",
    "StartEvent",
    "StepEvent",
    "log_path",
    "parse_event",
    "parse_events",
    "read_events",
]
