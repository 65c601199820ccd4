"""Per-rank JSON-lines event log, ``<log-dir>/rank<R>.jsonl`` (docs/ARCHITECTURE.md).

Records, one JSON object per line, appended and flushed as they happen:

* ``{"event": "start", "time", "rank", "attempt", "resumed_from_step", "pid", "world_size"}``
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
bitwise comparison; ``resumed_from_step`` is ``null`` on a fresh start;
``pid`` (an addition to the contract) lets a reader map a rank to the
process whose metric files it wrote; ``world_size`` (another) is the size of
the rendezvous this start belongs to, which an elastic job changes. Restarts append to the same file, so a
step can appear once per attempt. No torch import here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


def log_path(log_dir: Path, rank: int) -> Path:
    """``<log_dir>/rank<rank>.jsonl``."""
    return log_dir / f"rank{rank}.jsonl"


class EventLog:
    """Appends event records for one rank.

    Args:
        log_dir: folder (created if missing).
        rank: global rank.
        attempt: torchrun restart count, copied into every record.
        clock: Unix time source (default :func:`time.time`).
        world_size: ranks of this incarnation's rendezvous (written in ``start``; None: left out).

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
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_path(log_dir, rank)
        self._rank = rank
        self._attempt = attempt
        self._world_size = world_size
        self._clock = clock
        self._file: TextIO = self.path.open("a", encoding="utf-8")

    def _write(self, record: dict[str, Any]) -> None:
        # One write() per line: a SIGKILL can cut the log between records, not inside one.
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def start(self, *, resumed_from_step: int | None) -> None:
        """The rank is ready to train (after any resume)."""
        self._write(
            {
                "event": "start",
                "time": self._clock(),
                "rank": self._rank,
                "attempt": self._attempt,
                "resumed_from_step": resumed_from_step,
                "pid": os.getpid(),
                **({} if self._world_size is None else {"world_size": self._world_size}),
            }
        )

    def step(self, *, step: int, loss: float, step_seconds: float) -> None:
        """One completed step with its global mean loss."""
        self._write(
            {
                "event": "step",
                "time": self._clock(),
                "step": step,
                "loss": loss,
                "loss_hex": float.hex(loss),
                "attempt": self._attempt,
                "step_seconds": step_seconds,
            }
        )

    def checkpoint(self, *, step: int) -> None:
        """A checkpoint of ``step`` is complete (renamed into place)."""
        self._write(
            {"event": "checkpoint", "time": self._clock(), "step": step, "attempt": self._attempt}
        )

    def checkpoint_failed(self, *, step: int, error: str) -> None:
        """The save after ``step`` failed (``error``: why, from every rank that failed)."""
        self._write(
            {
                "event": "checkpoint_failed",
                "time": self._clock(),
                "step": step,
                "attempt": self._attempt,
                "error": error,
            }
        )

    def done(self, *, step: int) -> None:
        """Training finished cleanly after ``step``."""
        self._write(
            {"event": "done", "time": self._clock(), "step": step, "attempt": self._attempt}
        )

    def fault(self, *, point: str, step: int) -> None:
        """Fault point ``point`` took effect during ``step``."""
        self._write(
            {
                "event": "fault",
                "time": self._clock(),
                "point": point,
                "step": step,
                "attempt": self._attempt,
            }
        )

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """Parse a ``rank<R>.jsonl`` file, skipping a torn last line (after a SIGKILL)."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


__all__ = ["EventLog", "log_path", "read_events"]
