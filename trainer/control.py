"""Chaos control channel: fault points armed per rank through a JSON file, polled once per step.

The chaos controller (or a person) writes ``<control-dir>/rank<R>.json``
(``--control-dir``; default ``<metrics-dir>/control``) atomically (write a
temporary file, then rename) to arm fault points on rank ``R``::

    {"faults": [
      {"point": "slow_step", "seconds": 0.5, "expires_at": 1767225600.0},
      {"point": "collective_delay", "seconds": 0.2, "op": "all_reduce", "mesh_dim": "tp",
       "expires_at": 1767225600.0},
      {"point": "collective_hang", "op": "all_gather", "expires_at": 1767225600.0},
      {"point": "error_at_step", "step": 12},
      {"point": "checkpoint_now", "requested_at": 1767225000.0}
    ]}

Fault points (:data:`POINTS`):

* ``slow_step``: sleep ``seconds`` of extra compute in every step, before
  the backward pass (a compute straggler, FC-14).
* ``collective_delay``: sleep ``seconds`` before issuing every matching
  collective (``op`` and ``mesh_dim`` filter; omitted = any).
* ``collective_hang``: block before issuing the first matching collective
  until the fault expires (forever without ``expires_at``) or its entry is
  removed (a chaos revert; the file is re-read while hanging): for the peers
  this rank never joins that collective (FC-10).
* ``error_at_step``: raise :class:`InjectedFault` at the start of ``step``.
* ``checkpoint_now``: save a checkpoint at the end of the current step on
  every rank, unless one was started after ``requested_at`` (Unix time). The
  ranks agree through the gradient-norm all-reduce, so a request written to
  any one rank's file is enough and costs no extra collective.

Every fault may carry ``expires_at`` (Unix time): from then on it is
disarmed; deleting the file, or removing the entry, disarms at once (at the
next poll). :meth:`ControlChannel.poll` runs once per step; it costs one
``stat`` when the file is missing or unchanged, and a disarmed collective
fault point costs nothing: the collective counter has no hook installed. A
file that does not parse is ignored (logged, counted by the caller) until
it changes. No torch import here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from stormwatch.trainer.errors import TrainerError

log = logging.getLogger(__name__)

#: How often a hung collective re-checks its expiry, seconds.
HANG_POLL_SECONDS = 0.05


class InjectedFault(TrainerError):
    """Raised by the ``error_at_step`` fault point."""


class ControlFileError(TrainerError):
    """The control file exists but is not valid JSON of the documented shape."""


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    expires_at: float | None = Field(default=None, description="Unix time; disarmed from then on")


class SlowStep(_Fault):
    point: Literal["slow_step"]
    seconds: float = Field(gt=0, le=3600)


class CollectiveDelay(_Fault):
    point: Literal["collective_delay"]
    seconds: float = Field(gt=0, le=3600)
    op: str | None = None
    mesh_dim: str | None = None


class CollectiveHang(_Fault):
    point: Literal["collective_hang"]
    op: str | None = None
    mesh_dim: str | None = None


class ErrorAtStep(_Fault):
    point: Literal["error_at_step"]
    step: int = Field(ge=1)


class CheckpointNow(_Fault):
    point: Literal["checkpoint_now"]
    requested_at: float


Fault = Annotated[
    SlowStep | CollectiveDelay | CollectiveHang | ErrorAtStep | CheckpointNow,
    Field(discriminator="point"),
]


class ControlFile(BaseModel):
    """The content of ``rank<R>.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    faults: tuple[Fault, ...] = ()


#: Names of the fault points.
POINTS = ("slow_step", "collective_delay", "collective_hang", "error_at_step", "checkpoint_now")

_ADAPTER = TypeAdapter(ControlFile)


def control_path(control_dir: Path, rank: int) -> Path:
    """``<control_dir>/rank<rank>.json``."""
    return control_dir / f"rank{rank}.json"


def _matches(fault: CollectiveDelay | CollectiveHang, op: str, mesh_dim: str) -> bool:
    return (fault.op is None or fault.op == op) and (
        fault.mesh_dim is None or fault.mesh_dim == mesh_dim
    )


@dataclass(frozen=True)
class Armed:
    """The fault points armed for one step (a snapshot taken by :meth:`ControlChannel.poll`)."""

    slow_seconds: float = 0.0
    delays: tuple[CollectiveDelay, ...] = ()
    hangs: tuple[CollectiveHang, ...] = ()
    error_steps: frozenset[int] = frozenset()
    checkpoint_requested_at: float | None = None
    points: frozenset[str] = field(default_factory=frozenset)

    @property
    def touches_collectives(self) -> bool:
        """True when a collective hook is needed this step."""
        return bool(self.delays or self.hangs)


NOTHING_ARMED = Armed()


class ControlChannel:
    """Reads one rank's control file and applies its fault points.

    Args:
        path: the rank's control file; ``None`` disables the channel.
        clock: Unix time source (default :func:`time.time`).
        sleep: sleep function (default :func:`time.sleep`).
        on_fire: called with a point's name each time it takes effect
            (settable attribute: the loop binds the current step).
    """

    def __init__(
        self,
        path: Path | None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        on_fire: Callable[[str], None] | None = None,
    ) -> None:
        self._path = path
        self._clock = clock
        self._sleep = sleep
        self.on_fire = on_fire
        self._stamp: tuple[int, int] | None = None
        self._parsed = ControlFile()
        self.armed = NOTHING_ARMED

    def poll(self) -> Armed:
        """Re-read the file if it changed and return what is armed now.

        Raises:
            ControlFileError: the file changed and does not parse (the
                previous faults are dropped; the next poll of the same
                content raises nothing).
        """
        if self._path is None:
            return NOTHING_ARMED
        try:
            stat = os.stat(self._path)
        except FileNotFoundError:
            self._stamp, self._parsed = None, ControlFile()
            self.armed = NOTHING_ARMED
            return self.armed
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._stamp, self._parsed = stamp, ControlFile()
            self.armed = NOTHING_ARMED
            try:
                self._parsed = _ADAPTER.validate_json(self._path.read_bytes())
            except (OSError, ValidationError) as exc:
                raise ControlFileError(f"control file {self._path}: {exc}") from exc
        if not self._parsed.faults:
            self.armed = NOTHING_ARMED
            return self.armed
        now = self._clock()
        live = [f for f in self._parsed.faults if f.expires_at is None or f.expires_at > now]
        requested = [f.requested_at for f in live if isinstance(f, CheckpointNow)]
        self.armed = Armed(
            slow_seconds=sum(f.seconds for f in live if isinstance(f, SlowStep)),
            delays=tuple(f for f in live if isinstance(f, CollectiveDelay)),
            hangs=tuple(f for f in live if isinstance(f, CollectiveHang)),
            error_steps=frozenset(f.step for f in live if isinstance(f, ErrorAtStep)),
            checkpoint_requested_at=max(requested) if requested else None,
            points=frozenset(f.point for f in live),
        )
        return self.armed

    def _fired(self, point: str) -> None:
        if self.on_fire is not None:
            self.on_fire(point)

    def check_step(self, step: int) -> None:
        """At the start of ``step``: raise :class:`InjectedFault` if armed for it."""
        if step in self.armed.error_steps:
            self._fired("error_at_step")
            raise InjectedFault(f"fault point error_at_step fired at step {step}")

    def slow_step(self) -> None:
        """Sleep the armed extra compute time (before the backward pass)."""
        if self.armed.slow_seconds > 0:
            self._fired("slow_step")
            self._sleep(self.armed.slow_seconds)

    def before_collective(self, op: str, mesh_dim: str) -> None:
        """Hook of the collective counter, installed only while a collective fault is armed."""
        for hang in self.armed.hangs:
            if _matches(hang, op, mesh_dim):
                self._fired("collective_hang")
                log.warning("fault point: collective_hang in %s over %s", op, mesh_dim)
                while hang.expires_at is None or self._clock() < hang.expires_at:
                    self._sleep(HANG_POLL_SECONDS)
                    if not self._still_armed(hang):
                        break  # its entry was removed (a chaos revert): the hang ends now
        for delay in self.armed.delays:
            if _matches(delay, op, mesh_dim):
                self._fired("collective_delay")
                self._sleep(delay.seconds)

    def _still_armed(self, hang: CollectiveHang) -> bool:
        """Re-read the file (one ``stat`` when unchanged): is ``hang`` still armed?"""
        try:
            self.poll()
        except ControlFileError:
            return False  # a file that does not parse drops every fault (see poll)
        return hang in self.armed.hangs

    def checkpoint_wanted(self, last_save_started_at: float | None) -> bool:
        """True when a ``checkpoint_now`` request is newer than the last save's start."""
        requested = self.armed.checkpoint_requested_at
        if requested is None:
            return False
        return last_save_started_at is None or requested > last_save_started_at


__all__ = [
    "HANG_POLL_SECONDS",
    "NOTHING_ARMED",
    "POINTS",
    "Armed",
    "CheckpointNow",
    "CollectiveDelay",
    "CollectiveHang",
    "ControlChannel",
    "ControlFile",
    "ControlFileError",
    "ErrorAtStep",
    "InjectedFault",
    "SlowStep",
    "control_path",
]
