"""What a step mark records and how long a step took.

:class:`StepRecord` is one optimizer step as a job measured it (what
:meth:`~stormwatch.telemetry.Session.record_step` takes; :meth:`Session.step` builds one).
:class:`StepClock` times steps for :meth:`Session.step`: from the previous mark to this
one, less the time spent in phases that are not part of a step (``checkpoint_save``,
``checkpoint_load``, ``eval``; a ``data_wait`` is, :mod:`stormwatch.telemetry.phases`).
It also counts how deep each phase is entered (a phase entered twice is left once it is
left twice). Not thread-safe: the session holds its lock around it. :class:`PhaseContext`
is the ``with`` block :meth:`Session.phase` returns. No torch import here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from stormwatch.telemetry.phases import PHASES, PhaseSpec


class _PhaseOwner(Protocol):
    def _enter_phase(self, spec: PhaseSpec) -> None: ...
    def _leave_phase(self, spec: PhaseSpec, *, failed: bool = False) -> None: ...


class PhaseContext:
    """The context manager :meth:`Session.phase` returns (usable once per ``with``)."""

    def __init__(self, session: _PhaseOwner | None, spec: PhaseSpec | None) -> None:
        self._session = session
        self._spec = spec

    def __enter__(self) -> PhaseContext:
        if self._session is not None and self._spec is not None:
            self._session._enter_phase(self._spec)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._session is not None and self._spec is not None:
            self._session._leave_phase(self._spec, failed=exc_info[0] is not None)


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One optimizer step as measured by the caller (:meth:`Session.record_step`).

    Attributes:
        step: the step that ended (>= 0).
        seconds: its wall time, seconds.
        loss: its loss (the global mean, if the job computes one); ``None``: not reported.
        tokens / samples: processed by this rank's data-parallel replica in the step.
        learning_rate: the learning rate used.
        grad_norm: global L2 norm of the gradients before the optimizer step.
        wait_seconds: wall time with a collective in flight (compute = seconds - wait);
            ``None``: no compute/wait breakdown exported.
        mfu / peak_flops: model FLOPs utilisation (0..1) against ``peak_flops`` FLOP/s.
        memory: kind (``rss``, ``cuda_max_allocated``) -> bytes.
        sample_rss: read this process's resident memory into the ``rss`` memory gauge off
            the training thread (the rank's flusher reads ``/proc`` within 0.1 s of the
            step, :mod:`stormwatch.telemetry.handoff.flusher`), instead of ``memory`` measured by
            the caller: what :meth:`Session.step` does.
    """

    step: int
    seconds: float
    loss: float | None = None
    tokens: int | None = None
    samples: int | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    wait_seconds: float | None = None
    mfu: float | None = None
    peak_flops: float | None = None
    memory: Mapping[str, int] | None = None
    sample_rss: bool = False


_PROCESS: list[Any] = []  # psutil.Process of this pid, made once (its init reads /proc)


def rss_bytes() -> dict[str, int]:
    """``{"rss": bytes}`` of this process (psutil), ``{}`` when it cannot be read."""
    try:
        import psutil

        if not _PROCESS or _PROCESS[0].pid != os.getpid():  # first call, or a forked child
            _PROCESS[:] = [psutil.Process()]
        return {"rss": int(_PROCESS[0].memory_info().rss)}
    except Exception:  # memory is optional: a step is recorded without it
        return {}


class StepClock:
    """Times steps between marks, leaving out-of-step phases out (module docstring).

    Args:
        monotonic: interval clock, seconds.
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._mark = monotonic()  # at the previous step mark (or the start)
        self._paused = 0.0  # seconds in out-of-step phases since the mark
        self._pausing_since: float | None = None  # an out-of-step phase is open
        self._depth: dict[str, int] = {}  # phase -> how deep it is entered
        self._stack: list[str] = []  # phases entered, in order (one item per entry)

    def restart(self) -> None:
        """The next step's time runs from now."""
        self._mark, self._paused = self._monotonic(), 0.0
        if self._pausing_since is not None:
            self._pausing_since = self._mark

    def lap(self) -> float:
        """Seconds of the step that ends now (and the next one starts)."""
        now = self._monotonic()
        paused = self._paused + (0.0 if self._pausing_since is None else now - self._pausing_since)
        seconds = max(now - self._mark - paused, 0.0)
        self._mark, self._paused = now, 0.0
        if self._pausing_since is not None:
            self._pausing_since = now
        return seconds

    def enter(self, spec: PhaseSpec) -> bool:
        """Phase ``spec`` entered; True when it was not entered already (outermost)."""
        depth = self._depth.get(spec.name, 0)
        self._depth[spec.name] = depth + 1
        self._stack.append(spec.name)
        if not spec.in_step and self._pausing_since is None:
            self._pausing_since = self._monotonic()
        return depth == 0

    def innermost(self) -> str | None:
        """The phase entered last among those still entered (None: in no phase)."""
        return self._stack[-1] if self._stack else None

    def leave(self, spec: PhaseSpec) -> bool:
        """Phase ``spec`` left; True when it is no longer entered at all."""
        depth = max(self._depth.get(spec.name, 0) - 1, 0)
        self._depth[spec.name] = depth
        if spec.name in self._stack:  # the latest entry of it
            del self._stack[len(self._stack) - 1 - self._stack[::-1].index(spec.name)]
        paused = any(n and not PHASES[name].in_step for name, n in self._depth.items())
        if not paused and self._pausing_since is not None:
            self._paused += self._monotonic() - self._pausing_since
            self._pausing_since = None
        return depth == 0


__all__ = ["PhaseContext", "StepClock", "StepRecord", "rss_bytes"]
