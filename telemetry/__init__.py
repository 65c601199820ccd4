"""Observe any PyTorch training job: the public telemetry API (docs/instrument-your-job.md).

Two lines make a job visible to the node agent, its alerts and post-mortems::

    import stormwatch.telemetry as swt

    swt.init()                                  # once, before init_process_group
    for step, batch in enumerate(loader, 1):
        loss = train_step(batch)
        swt.step(step, loss=loss.item(), tokens=batch.numel())

plus, where they apply, ``with swt.phase("checkpoint_save"): ...`` around work that
legitimately pauses progress (``checkpoint_save``, ``checkpoint_load``, ``eval``,
``data_wait``; bounds in :mod:`stormwatch.telemetry.phases`) and
``swt.checkpoint(step)`` when a checkpoint is committed. The functions act on one
per-process :class:`Session` (:func:`init` makes it, :func:`session` returns it);
:class:`Session` has the same methods and a few more for jobs that measure themselves
(:meth:`Session.record_step`, :meth:`Session.collective_counter`, :meth:`Session.span`,
...), plus the MFU arithmetic (:func:`flops_per_token`, :func:`mfu`, :func:`peak_flops`)
and what a failed save's exception says (:func:`lost_peer`, :func:`rank_failures`):
the names of :data:`__all__` are the public API, and all the reference trainer uses.

Promises: importing this package does not import torch (collective counting does, when
asked for); nothing here raises into training: a misuse (a call before :func:`init`, a
second :func:`init` with other arguments, a negative or non-integer step, an unknown
phase, an unwritable folder) is ONE warning per kind on the ``stormwatch.telemetry``
logger naming the argument and the fix, and the call is ignored; a failure inside is
logged and counted (``stormwatch_train_telemetry_errors_total``). A NaN or infinite loss
is warned about once but recorded, since the ``StormwatchLossNaN`` alert needs it.

What the agent reads (metric names and labels, the event log, the done marker, the
post-mortem dumps) is documented in docs/ARCHITECTURE.md "Trainer -> agent telemetry";
the modules below this package write it: :mod:`.metrics`, :mod:`.events`,
:mod:`.rank`, :mod:`.comms` and :mod:`.collective_ops` (collective counting),
:mod:`.dump` (post-mortem dumps), :mod:`.ranklogs` (reading a job's logs), :mod:`.perf`,
:mod:`.tracing`; the phases and their bounds are :mod:`.phases`, and the session's parts
are in :mod:`.lifecycle`.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stormwatch.telemetry.dump import DEFAULT_FLIGHT_RECORDER_ENTRIES, MAX_FLIGHT_RECORDER_ENTRIES
from stormwatch.telemetry.failures import lost_peer, rank_failures
from stormwatch.telemetry.lifecycle import launch
from stormwatch.telemetry.lifecycle.guard import LOGGER_NAME, never_raises, warn_once
from stormwatch.telemetry.lifecycle.session import PhaseContext, Session
from stormwatch.telemetry.lifecycle.steps import StepRecord
from stormwatch.telemetry.perf import flops_per_token, mfu, peak_flops
from stormwatch.telemetry.phases import PHASE_BOUNDS_ENV, PHASES, parse_bounds

if TYPE_CHECKING:
    from stormwatch.telemetry.comms import CollectiveCounter


class _Current:
    """The process's session and the arguments it was made with (one per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.session: Session | None = None
        self.requested: dict[str, Any] = {}
        self.fork_hook = False  # _after_fork_in_child is registered
        self.owner_by_init = False  # init() set OWNER_ENV (else `stormwatch run` had set it)


_CURRENT = _Current()


def _before_init(call: str) -> None:
    warn_once(
        f"{call}:before_init",
        "%s() before init(): ignored (call stormwatch.telemetry.init() first, once per process)",
        call,
    )


def _flag(name: str, value: object, default: bool) -> bool:
    if isinstance(value, bool):
        return value
    warn_once(f"init:{name}", "init(%s=%r): must be True or False; using %s", name, value, default)
    return default


def _entries(value: object) -> int:
    """``flight_recorder``: True (the default ring), False or 0 (off), or a ring size."""
    if isinstance(value, bool):
        return DEFAULT_FLIGHT_RECORDER_ENTRIES if value else 0
    if isinstance(value, int) and value > MAX_FLIGHT_RECORDER_ENTRIES:
        warn_once(
            "init:flight_recorder_value",
            "init(flight_recorder=%d): above the largest ring, %d entries (torch would fail "
            "to allocate it or hang); using %d",
            value,
            MAX_FLIGHT_RECORDER_ENTRIES,
            MAX_FLIGHT_RECORDER_ENTRIES,
        )
        return MAX_FLIGHT_RECORDER_ENTRIES
    if isinstance(value, int) and value >= 0:
        return value
    warn_once(
        "init:flight_recorder_value",
        "init(flight_recorder=%r): must be True, False or a ring size (an int >= 0); using %d",
        value,
        DEFAULT_FLIGHT_RECORDER_ENTRIES,
    )
    return DEFAULT_FLIGHT_RECORDER_ENTRIES


def _settings(requested: Mapping[str, Any], environ: Mapping[str, str]) -> launch.Settings:
    job, problem = launch.resolve_job(requested["job"], environ)
    if problem:
        warn_once("init:job", "init(): %s", problem)
    job, problem = launch.encodable_job(job, "job")
    if problem:
        warn_once("init:job_encoding", "init(): %s", problem)
    folders = {}
    for name in launch.FOLDER_ENV:
        folders[name], problem = launch.resolve_folder(name, requested[name], environ)
        if problem:
            warn_once(f"init:{name}", "init(): %s", problem)
    if folders["metrics_dir"] is not None:
        problem = launch.metrics_space_problem(folders["metrics_dir"])
        if problem:
            warn_once("init:metrics_dir", "init(): %s", problem)
            folders["metrics_dir"] = None
    bounds, problems = parse_bounds(environ.get(PHASE_BOUNDS_ENV, ""))
    for problem in problems:
        warn_once("init:phase_bounds", "init(): %s; that phase keeps its default bound", problem)
    return launch.Settings(
        job=job,
        metrics_dir=folders["metrics_dir"],
        log_dir=folders["log_dir"],
        dump_dir=folders["dump_dir"],
        collectives=_flag("collectives", requested["collectives"], True),
        flight_recorder=_entries(requested["flight_recorder"]),
        handle_signals=_flag("handle_signals", requested["handle_signals"], True),
        phase_bounds=bounds,
    )


def _enable_flight_recorder(settings: launch.Settings) -> None:
    """Set PyTorch's flight-recorder variables (read when the process group is made)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        warn_once(
            "init:flight_recorder",
            "init() after torch.distributed.init_process_group: the flight recorder is on "
            "only if TORCH_FR_BUFFER_SIZE was set before; call init() first",
        )
        return
    from stormwatch.telemetry.dump import flight_recorder_environ

    os.environ.update(flight_recorder_environ(settings.dump_dir, settings.flight_recorder))


def _disabled() -> Session:
    """A session with no outputs, handlers or threads (its calls do nothing)."""
    return Session(launch.Settings(collectives=False, handle_signals=False), launch.Placement())


def _after_fork_in_child() -> None:
    """A forked child (a ``multiprocessing`` fork worker, a ``Pool``'s) inherits the rank's
    session, its SIGTERM handler and wakeup pipe: it is not the rank, so all are dropped
    (no done record, no dumps, no ``atexit`` writes); its own ``init()`` gets a disabled
    session. (No lock taken: another thread may have held it at the fork.)"""
    inherited = _CURRENT.session
    if inherited is not None and not inherited.closed:
        inherited._forget_in_child()
        _CURRENT.session = _disabled()


def _new_session(requested: Mapping[str, Any]) -> Session:
    owner = launch.rank_owner(os.environ, os.getpid())
    if owner is not None:
        warn_once(
            "init:not_the_rank",
            "init() in pid %d: this is a process the rank (pid %d, %s) started (a data-loader "
            "worker, a helper), not the rank: its telemetry is off (no files, no handlers); "
            "only the rank's main process records",
            os.getpid(),
            owner,
            launch.OWNER_ENV,
        )
        return _disabled()
    if os.environ.get(launch.OWNER_ENV) != str(os.getpid()):
        os.environ[launch.OWNER_ENV] = str(os.getpid())  # inherited by what it starts
        _CURRENT.owner_by_init = True
    if not _CURRENT.fork_hook:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _CURRENT.fork_hook = True
    where, problems = launch.placement(os.environ)
    for problem in problems:
        warn_once("init:placement", "init(): %s", problem)
    if where.launcher == "none":
        warn_once(
            "init:not_distributed",
            "init(): not started by torchrun or srun (no RANK/WORLD_SIZE, no "
            "SLURM_PROCID/SLURM_NTASKS): recorded as rank 0 of 1",
        )
    settings = _settings(requested, os.environ)
    if settings.flight_recorder:
        _enable_flight_recorder(settings)
    made = Session(settings, where)
    problem = made._install_exits()
    if problem:
        warn_once("init:signals", "init(): SIGTERM is not handled: %s", problem)
    if settings.collectives:
        made.instrument_collectives()
    made._answer_dump_requests()
    return made


def _warn_kept(requested: dict[str, Any], first: dict[str, Any], current: Session) -> None:
    """One warning: a later ``init()`` asked for other settings than the session has."""
    differ = ", ".join(
        f"{k}={v!r} (kept {first.get(k)!r})" for k, v in requested.items() if first.get(k) != v
    )
    if os.environ.get(launch.OWNER_ENV) == str(os.getpid()) and not _CURRENT.owner_by_init:
        warn_once(
            "init:twice",
            "init(%s) is ignored: `stormwatch run` already started this rank's session "
            "(job=%r); give those settings to `stormwatch run` (--job, --metrics-dir, "
            "--log-dir, --dump-dir) or run the job without it",
            differ,
            current.job,
        )
        return
    warn_once(
        "init:twice",
        "init() called again with other arguments: %s; the first session is kept "
        "(job=%r, rank %d); call init() once per process",
        differ,
        current.job,
        current.rank,
    )


def init(
    *,
    job: str | None = None,
    metrics_dir: str | os.PathLike[str] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    dump_dir: str | os.PathLike[str] | None = None,
    collectives: bool = True,
    flight_recorder: bool | int = True,
    handle_signals: bool = True,
) -> Session:
    """Start this process's telemetry session (once; a second call returns the same one).

    Rank, local rank, world size and attempt come from torchrun (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``TORCHELASTIC_RESTART_COUNT``), else srun
    (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_RESTART_COUNT``),
    else the process is rank 0 of 1 (one warning).

    Args:
        job: the job's name, the ``training_job`` label; default ``STORMWATCH_JOB``, else
            ``TORCHELASTIC_RUN_ID``, else ``SLURM_JOB_NAME``, else ``"train"``. Set
            ``STORMWATCH_JOB`` to the name the node agent uses.
        metrics_dir: the node agent's metrics folder (prometheus-client multiprocess
            files); default ``STORMWATCH_METRICS_DIR``; ``None``: no metrics.
        log_dir: folder of the event log ``rank<R>.jsonl``; default ``STORMWATCH_LOG_DIR``.
        dump_dir: folder of post-mortem dumps ``rank<R>.attempt<A>.pid<P>.json`` (on SIGTERM, by
            :meth:`Session.dump`); default ``STORMWATCH_DUMP_DIR``.
        collectives: count every c10d collective of this thread (and autograd's), now if
            the process group exists, else as soon as ``init_process_group`` returns.
        flight_recorder: enable PyTorch's flight recorder (``TORCH_FR_BUFFER_SIZE``
            :data:`DEFAULT_FLIGHT_RECORDER_ENTRIES`, or this many entries when an int,
            unless the variable is set; ``TORCH_FR_DUMP_TEMP_FILE`` under ``dump_dir``),
            read into the dumps; call :func:`init` before the process group exists.
        handle_signals: on SIGTERM write the dump, then hand the signal on to the
            previous handler.

    Returns:
        The session. A folder that cannot be written turns that output off (one warning).
        ``STORMWATCH_PHASE_BOUNDS`` (``eval=7200,...``) changes the phases' bounds.
    """
    requested = {
        "job": job,
        "metrics_dir": metrics_dir,
        "log_dir": log_dir,
        "dump_dir": dump_dir,
        "collectives": collectives,
        "flight_recorder": flight_recorder,
        "handle_signals": handle_signals,
    }
    with _CURRENT.lock:
        current = _CURRENT.session
        if current is not None and not current.closed:
            if requested != _CURRENT.requested:
                _warn_kept(requested, _CURRENT.requested, current)
            current.leave_start_to_job()  # the job took the session over: it starts it
            return current
        try:
            made = _new_session(requested)
        except Exception as exc:
            warn_once(
                "init:failed",
                "init() failed inside stormwatch (%s: %s); telemetry is off, training continues",
                type(exc).__name__,
                exc,
            )
            made = _disabled()
        _CURRENT.session, _CURRENT.requested = made, requested
        return made


def session() -> Session | None:
    """The process's session (``None`` before :func:`init`)."""
    return _CURRENT.session


@never_raises()
def step(
    step: int,
    *,
    loss: float | None = None,
    tokens: int | None = None,
    samples: int | None = None,
    lr: float | None = None,
    grad_norm: float | None = None,
) -> None:
    """Mark the END of optimizer step ``step`` (an int >= 0).

    Its time is the wall time since the previous mark, less checkpoint and eval phases.
    ``loss`` (the value to alert on; a one-element tensor is read with ``float()``, a
    device sync), ``tokens``/``samples`` processed by this rank's data-parallel replica in
    the step, the learning rate ``lr`` and the gradient norm are optional.
    """
    current = _CURRENT.session
    if current is None:
        _before_init("step")
        return
    current.step(step, loss=loss, tokens=tokens, samples=samples, lr=lr, grad_norm=grad_norm)


@never_raises(default=PhaseContext(None, None))
def phase(name: str, *, bound_seconds: float | None = None) -> PhaseContext:
    """``with phase(name):`` marks work that legitimately pauses progress (``name``: one of
    :data:`PHASES`). Inside, neither the agent nor the rules call the rank hung, up to the
    phase's bound (``bound_seconds`` for this entry, e.g. a multiple of the last save's
    duration; default: the phase's, or ``STORMWATCH_PHASE_BOUNDS``); past it the rank is
    judged by its heartbeat again, and a hang is named by the phase. Before the first
    step, mark the start-up stages ``rendezvous`` (done by itself around
    ``init_process_group`` when collectives are counted), ``mesh``, ``parallelize`` and
    ``checkpoint_load``: entering one starts the heartbeat."""
    current = _CURRENT.session
    if current is None:
        _before_init("phase")
        return PhaseContext(None, None)
    return current.phase(name, bound_seconds=bound_seconds)


@never_raises()
def checkpoint(step: int, *, error: str | BaseException | None = None) -> None:
    """A checkpoint of ``step`` was committed (complete on disk), or its save failed with
    ``error`` (the job trained on).

    A save cut short by the job ending is logged, not counted as failed: one after the rank
    was asked to stop (SIGTERM), or whose ``error`` (an exception, not its text) says a peer
    was lost (:func:`stormwatch.telemetry.failures.lost_peer`: a rank died or left)."""
    current = _CURRENT.session
    if current is None:
        _before_init("checkpoint")
        return
    current.checkpoint(step, error=error)


def instrument_collectives() -> None:
    """Count every c10d collective (idempotent; what ``init(collectives=True)`` does)."""
    current = _CURRENT.session
    if current is None:
        _before_init("instrument_collectives")
        return
    current.instrument_collectives()


def shutdown() -> None:
    """End the session cleanly: done record and marker, files closed. Runs by itself at
    interpreter exit (without the done marker after an unhandled exception)."""
    current = _CURRENT.session
    if current is None:
        _before_init("shutdown")
        return
    current.shutdown()


def __getattr__(name: str) -> Any:
    if name == "CollectiveCounter":  # imports torch
        from stormwatch.telemetry.comms import CollectiveCounter

        return CollectiveCounter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_FLIGHT_RECORDER_ENTRIES",
    "LOGGER_NAME",
    "PHASES",
    "CollectiveCounter",
    "PhaseContext",
    "Session",
    "StepRecord",
    "checkpoint",
    "flops_per_token",
    "init",
    "instrument_collectives",
    "lost_peer",
    "mfu",
    "peak_flops",
    "phase",
    "rank_failures",
    "session",
    "shutdown",
    "step",
]
