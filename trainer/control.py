"""The trainer's end of the chaos control channel: fault points armed per rank, polled per step.

The file ``<control-dir>/rank<R>.json`` (``--control-dir``; default
``<metrics-dir>/control``) and its entries are :mod:`stormwatch.faults.control_file`
(the one model its writers use too: the agent's ``trainer_fault``, the platforms'
``checkpoint_now``, tests). :class:`ControlChannel` reads it with that model and
applies the points:

* ``slow_step``, ``collective_delay``, ``collective_hang``, ``error_at_step``,
  ``checkpoint_now``: as documented there (the ranks agree on ``checkpoint_now``
  through the gradient-norm all-reduce, so a request written to any one rank's file
  is enough and costs no extra collective);
* ``kill_at_step`` / ``freeze_at_step``: SIGKILL / SIGSTOP at the start of the step
  (:meth:`ControlChannel.check_step`);
* ``checkpoint_kill``: SIGKILL at a phase of a save (:meth:`ControlChannel.checkpoint_phase`,
  the checkpointer's fault hook);
* ``stage_hang``, ``stage_kill``, ``stage_freeze``: at the start of a start-up stage
  (:meth:`ControlChannel.stage`, called by the loop inside each stage before the first
  step; the file is polled there too).

An entry with ``attempt`` arms only in that attempt of the job (the job-wide count every
rank agreed, :mod:`stormwatch.telemetry.restarts`, once the process group exists: before
it, in the ``rendezvous`` stage, the node's ``TORCHELASTIC_RESTART_COUNT``); one with ``expires_at``
is disarmed from then on; deleting the file, or removing the entry, disarms at once
(at the next poll). :meth:`ControlChannel.poll` runs once per step, before anything
else of the step; it costs one ``stat`` when the file is missing or unchanged, and a
disarmed collective fault point costs nothing: the collective counter has no hook
installed. A file that does not parse is ignored (logged, counted by the caller)
until it changes. No torch import here.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from stormwatch.faults.control_file import (
    CheckpointKill,
    CheckpointNow,
    CollectiveDelay,
    CollectiveHang,
    ControlEntry,
    ControlFile,
    ErrorAtStep,
    FreezeAtStep,
    KillAtStep,
    SlowStep,
    StageFreeze,
    StageHang,
    StageKill,
)
from stormwatch.trainer.errors import ControlFileError, InjectedFault

log = logging.getLogger(__name__)

#: How often a hung collective re-checks its expiry, seconds.
HANG_POLL_SECONDS = 0.05


_ADAPTER = TypeAdapter(ControlFile)


def _matches(fault: CollectiveDelay | CollectiveHang, op: str, mesh_dim: str) -> bool:
    return (fault.op is None or fault.op == op) and (
        fault.mesh_dim is None or fault.mesh_dim == mesh_dim
    )


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _freeze_self(seconds: float | None) -> None:
    """SIGSTOP this process; with ``seconds``, a detached helper sends SIGCONT that much later
    (the stopped process cannot). A signal sent meanwhile (torchrun's SIGTERM) stays pending
    until then; SIGKILL ends it at once."""
    pid = os.getpid()
    if seconds is not None:
        subprocess.Popen(
            ["/bin/sh", "-c", f"sleep {seconds:.3f}; kill -CONT {pid}"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    os.kill(pid, signal.SIGSTOP)


@dataclass(frozen=True)
class Armed:
    """The fault points armed for one step (a snapshot taken by :meth:`ControlChannel.poll`)."""

    slow_seconds: float = 0.0
    delays: tuple[CollectiveDelay, ...] = ()
    hangs: tuple[CollectiveHang, ...] = ()
    error_steps: frozenset[int] = frozenset()
    checkpoint_requested_at: float | None = None
    kill_steps: frozenset[int] = frozenset()
    freezes: tuple[FreezeAtStep, ...] = ()
    checkpoint_kills: frozenset[tuple[str, int]] = frozenset()
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
        attempt: the job's attempt (settable attribute :attr:`attempt`: the node's
            ``TORCHELASTIC_RESTART_COUNT`` until the ranks agree the job's); entries for
            another attempt are not armed.
        clock: Unix time source (default :func:`time.time`).
        sleep: sleep function (default :func:`time.sleep`).
        kill: ends this process at once (default: SIGKILL to itself).
        freeze: stops this process, called with the seconds until it is resumed or
            ``None`` (default: SIGSTOP to itself, SIGCONT from a helper process).
        on_fire: called with a point's name each time it takes effect
            (settable attribute: the loop binds the current step).
    """

    def __init__(
        self,
        path: Path | None,
        *,
        attempt: int = 0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        kill: Callable[[], None] = _kill_self,
        freeze: Callable[[float | None], None] = _freeze_self,
        on_fire: Callable[[str], None] | None = None,
    ) -> None:
        self._path = path
        self.attempt = attempt
        self._clock = clock
        self._sleep = sleep
        self._kill = kill
        self._freeze = freeze
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
        self.armed = self._snapshot()
        return self.armed

    def _live(self) -> list[ControlEntry]:
        """The entries armed now: not expired, and for this attempt (or every one)."""
        now = self._clock()
        return [
            f
            for f in self._parsed.faults
            if (f.expires_at is None or f.expires_at > now)
            and (f.attempt is None or f.attempt == self.attempt)
        ]

    def _snapshot(self) -> Armed:
        live = self._live()
        requested = [f.requested_at for f in live if isinstance(f, CheckpointNow)]
        return Armed(
            slow_seconds=sum(f.seconds for f in live if isinstance(f, SlowStep)),
            delays=tuple(f for f in live if isinstance(f, CollectiveDelay)),
            hangs=tuple(f for f in live if isinstance(f, CollectiveHang)),
            error_steps=frozenset(f.step for f in live if isinstance(f, ErrorAtStep)),
            checkpoint_requested_at=max(requested) if requested else None,
            kill_steps=frozenset(f.step for f in live if isinstance(f, KillAtStep)),
            freezes=tuple(f for f in live if isinstance(f, FreezeAtStep)),
            checkpoint_kills=frozenset(
                (f.phase, f.step) for f in live if isinstance(f, CheckpointKill)
            ),
            points=frozenset(f.point for f in live),
        )

    def _fired(self, point: str) -> None:
        if self.on_fire is not None:
            self.on_fire(point)

    def check_step(self, step: int) -> None:
        """At the start of ``step``: SIGKILL this process (``kill_at_step``), SIGSTOP it
        (``freeze_at_step``), or raise :class:`InjectedFault` (``error_at_step``), if armed
        for it."""
        if step in self.armed.kill_steps:
            self._fired("kill_at_step")
            log.warning("fault point: SIGKILL at the start of step %d (pid %d)", step, os.getpid())
            self._kill()
        for freeze in self.armed.freezes:
            if freeze.step == step:
                self._fired("freeze_at_step")
                log.warning(
                    "fault point: SIGSTOP at the start of step %d (pid %d) for %s",
                    step,
                    os.getpid(),
                    "ever" if freeze.seconds is None else f"{freeze.seconds:g} s",
                )
                self._freeze(freeze.seconds)
        if step in self.armed.error_steps:
            self._fired("error_at_step")
            raise InjectedFault(f"fault point error_at_step fired at step {step}")

    def stage(self, name: str) -> None:
        """At the start of start-up stage ``name`` (inside it): poll the file, then apply the
        ``stage_kill``, ``stage_freeze`` and ``stage_hang`` entries armed for it.

        Raises:
            ControlFileError: the file changed and does not parse (nothing is applied).
        """
        self.poll()
        live = [f for f in self._live() if getattr(f, "stage", None) == name]
        for fault in live:
            if isinstance(fault, StageKill):
                self._fired("stage_kill")
                log.warning("fault point: SIGKILL at stage %s (pid %d)", name, os.getpid())
                self._kill()
        for fault in live:
            if isinstance(fault, StageFreeze):
                self._fired("stage_freeze")
                log.warning("fault point: SIGSTOP at stage %s (pid %d)", name, os.getpid())
                self._freeze(fault.seconds)
        for fault in live:
            if isinstance(fault, StageHang):
                self._fired("stage_hang")
                log.warning("fault point: stage_hang at stage %s", name)
                self._block(fault, lambda hang: hang in self._parsed.faults)

    def _block(self, fault: StageHang | CollectiveHang, armed: Callable[[Any], bool]) -> None:
        """Block until ``fault`` expires, or until a re-read of the file (one ``stat`` when
        unchanged) no longer has it (``armed``: a chaos revert removed the entry)."""
        while fault.expires_at is None or self._clock() < fault.expires_at:
            self._sleep(HANG_POLL_SECONDS)
            try:
                self.poll()
            except ControlFileError:
                return  # a file that does not parse drops every fault (see poll)
            if not armed(fault):
                return

    def checkpoint_phase(self, phase: str, step: int) -> None:
        """The checkpointer's fault hook: SIGKILL this process if ``(phase, step)`` is armed
        (``checkpoint_kill``). Not passed to ``on_fire``: it may run on the writer thread of
        an async save, and the process ends at once."""
        if (phase, step) in self.armed.checkpoint_kills:
            log.warning("fault point: SIGKILL at %s of the save of step %d", phase, step)
            self._kill()

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
                self._block(hang, lambda h: h in self.armed.hangs)
        for delay in self.armed.delays:
            if _matches(delay, op, mesh_dim):
                self._fired("collective_delay")
                self._sleep(delay.seconds)

    def checkpoint_wanted(self, last_save_started_at: float | None) -> bool:
        """True when a ``checkpoint_now`` request is newer than the last save's start."""
        requested = self.armed.checkpoint_requested_at
        if requested is None:
            return False
        return last_save_started_at is None or requested > last_save_started_at


__all__ = [
    "HANG_POLL_SECONDS",
    "NOTHING_ARMED",
    "Armed",
    "ControlChannel",
    "ControlFileError",
    "InjectedFault",
]
