"""One process's telemetry session: what :func:`stormwatch.telemetry.init` returns.

A :class:`Session` owns the rank's :class:`~stormwatch.telemetry.rank.RankTelemetry`
(metrics, event log, done marker), its post-mortem dumper, the collective counter once
collectives are instrumented, and the exit hooks. Every public method keeps the API's
promise: a bad value or a call after :meth:`Session.shutdown` is one warning per kind,
a failure inside is one warning, and nothing raises into training. No torch import here.

Step time (:meth:`Session.step`): since the previous mark, less the phases that are not
part of a step (:mod:`.steps`); its collective wait assumes the step's collectives have
completed when it is marked (true after ``optimizer.step()`` with DDP and FSDP).

The start record is written by :meth:`Session.start`, else at the first step or
checkpoint mark (under ``stormwatch run`` with no API call: once collectives are
counted); then ``resumed_from_step`` is the first step marked minus one only when that
is above 1 and the run resumes (attempt > 0, or a ``checkpoint_load`` phase came first).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stormwatch.telemetry.dump import RankDumper
from stormwatch.telemetry.dump_requests import DumpRequestWatcher
from stormwatch.telemetry.lifecycle import checks
from stormwatch.telemetry.lifecycle.collectives import Collectives
from stormwatch.telemetry.lifecycle.exits import ExitHooks
from stormwatch.telemetry.lifecycle.guard import never_raises, warn_once
from stormwatch.telemetry.lifecycle.launch import Placement, Settings
from stormwatch.telemetry.lifecycle.sigterm import SigtermDump
from stormwatch.telemetry.lifecycle.spans import SessionSpans
from stormwatch.telemetry.lifecycle.steps import PhaseContext, StepClock, StepRecord
from stormwatch.telemetry.phases import PHASES, PhaseSpec
from stormwatch.telemetry.rank import RankTelemetry
from stormwatch.telemetry.restarts import JobAttempt, agree_job_attempt


class Session:
    """One process's telemetry (see the module docstring); made by :func:`init`.

    Args:
        settings: the resolved job name, folders and switches.
        where: this process's rank, local rank, world size and attempt.
        clock: Unix time source; monotonic: interval clock (seconds).
    """

    def __init__(
        self,
        settings: Settings,
        where: Placement,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.placement = where
        self._clock = clock
        self._lock = threading.RLock()
        self._telemetry = RankTelemetry(
            settings,
            rank=where.rank,
            world_size=where.world_size,
            attempt=where.attempt,
            clock=clock,
        )
        self._dumper = RankDumper(
            settings.dump_dir, rank=where.rank, attempt=where.attempt, clock=clock
        )
        self._collectives = Collectives(
            self._telemetry, on_made=self._counter_made, on_counting=self._counting_began
        )
        self._started = False
        self._start_with_counting = False  # stormwatch run's session: see start_with_counting
        self._loaded_checkpoint = False  # a checkpoint_load phase ran before the first mark
        self._last_step: int | None = None
        self._resumed: int | None = None
        self._steps = StepClock(monotonic)
        self._spans = SessionSpans(self._telemetry.on_error)
        self._closed = False
        self._signalled = False  # SIGTERM arrived: the process does not end cleanly
        # the innermost phase an exception left since the last mark: what a later dump names
        self._failed_phase: str | None = None
        self._exits = ExitHooks(self._at_exit, self._on_signal)
        self._sigterm = SigtermDump(  # the main thread waits in C++: exits.end_unanswered
            self._signal_dump,
            lambda: self._exits.end_unanswered(lambda: self.shutdown(clean=False)),
        )
        self._stop_watch = SigtermDump(lambda _how: self.stop_requested())  # .sigterm's end
        self._requests: DumpRequestWatcher | None = None
        self.job_attempt: JobAttempt | None = None  # agree_attempt()'s, once agreed

    def _answer_dump_requests(self) -> None:
        """Answer the node agent's dump requests from a daemon thread (with a dump folder)."""
        if self.settings.dump_dir is not None and self._requests is None:
            answer = functools.partial(self.dump, requested=True)  # a file of its own
            self._requests = DumpRequestWatcher(self.settings.dump_dir, self.rank, answer)
            self._requests.start()

    # ------------------------------------------------------------------ identity
    @property
    def rank(self) -> int:
        return self.placement.rank

    @property
    def local_rank(self) -> int:
        return self.placement.local_rank

    @property
    def world_size(self) -> int:
        return self.placement.world_size

    @property
    def attempt(self) -> int:
        return self.placement.attempt

    @never_raises()
    def agree_attempt(self) -> JobAttempt | None:
        """Agree the job-wide attempt with every rank (collective: every rank, once the
        default process group exists; :mod:`stormwatch.telemetry.restarts`), export it and
        put it in the start record; ``None`` when it failed (warned)."""
        where = self.settings.log_dir or self.settings.dump_dir or self.settings.metrics_dir
        agreed = agree_job_attempt(job=self.job, node_restarts=self.attempt, folder=where)
        self._telemetry.job_attempt(agreed.attempt, failed_nodes=agreed.failed_nodes)
        self.job_attempt = agreed
        return agreed

    @property
    def job(self) -> str:
        return self.settings.job

    @property
    def closed(self) -> bool:
        """:meth:`shutdown` has run."""
        return self._closed

    def _open(self, call: str) -> bool:
        if self._closed:
            message = "%s() after shutdown(): ignored (call init() again for a new session)"
            warn_once(f"{call}:after_shutdown", message, call)
        return not self._closed

    # ------------------------------------------------------------------ lifecycle
    def _install_exits(self) -> str | None:
        problem = self._exits.install(handle_signals=self.settings.handle_signals)
        if problem is None:  # the dump or stop mark also while the main thread is in C++
            (self._sigterm if self.settings.handle_signals else self._stop_watch).watch()
        return problem

    def dump_first_on_sigterm(self) -> bool:
        """Put the SIGTERM dump in front of the handlers installed since :func:`init` (a
        framework's, e.g. Lightning's, which may block in a collective first); whether it
        is in front. Main thread only; nothing when the session does not handle signals."""
        return self.settings.handle_signals and self._sigterm.take_front()

    @property
    def dumped_on_sigterm(self) -> bool:
        """Whether a SIGTERM's dump was written (a later dump would hide that moment)."""
        return self._sigterm.dumped

    @never_raises()
    def start(self, *, resumed_from_step: int | None = None) -> None:
        """Write the start record now (rank, attempt, pid, world size, the step resumed
        from or ``None``) and start the heartbeat. Once per session; without this call
        the first step or checkpoint mark writes it."""
        if not self._open("start"):
            return
        ok, resumed = checks.count("resumed_from_step", resumed_from_step, call="start")
        if not ok:
            return
        if self._started:
            warn_once("start:twice", "start() twice: the start record is written once; ignored")
            return
        with self._lock:
            self._steps.restart()  # the first step's time runs from here
        self._start(resumed)

    def _start(self, resumed: int | None) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            self._resumed = resumed
        self._telemetry.start(resumed_from_step=resumed)

    def _ensure_started(self, first_step: int | None) -> None:
        if self._started:
            return
        resuming = self.placement.attempt > 0 or self._loaded_checkpoint  # not every Nth step
        self._start(first_step - 1 if first_step and first_step > 1 and resuming else None)

    def start_with_counting(self) -> None:
        """Write the start record once collectives are counted, unless the job marks first
        (``stormwatch run``'s session: its job may never call the API)."""
        self._start_with_counting = not self._started

    def leave_start_to_job(self) -> None:
        """Undo :meth:`start_with_counting`: the job calls the API itself."""
        self._start_with_counting = False

    def _counting_began(self) -> None:
        if self._start_with_counting:
            self._ensure_started(None)
        self._telemetry.progress()

    # ------------------------------------------------------------------ steps
    @never_raises()
    def step(
        self,
        step: int,
        *,
        loss: float | None = None,
        tokens: int | None = None,
        samples: int | None = None,
        lr: float | None = None,
        grad_norm: float | None = None,
    ) -> None:
        """Mark the END of optimizer step ``step``; see :func:`stormwatch.telemetry.step`."""
        if not self._open("step"):
            return
        args = checks.step_args(
            step, loss=loss, tokens=tokens, samples=samples, lr=lr, grad_norm=grad_norm
        )
        if args is None:
            return
        self._ensure_started(args.step)
        with self._lock:
            seconds = self._steps.lap()
            self._failed_phase = None
        if self.settings.collectives:
            self._collectives.always_if_initialised()
        wait = self._collectives.step_wait(seconds)
        self.record_step(
            StepRecord(
                step=args.step,
                seconds=seconds,
                loss=args.loss,
                tokens=args.tokens,
                samples=args.samples,
                learning_rate=args.learning_rate,
                grad_norm=args.grad_norm,
                wait_seconds=wait,
                sample_rss=True,  # read by the flusher: no /proc read on this thread
            )
        )

    @never_raises()
    def record_step(self, record: StepRecord) -> None:
        """Record a step the caller measured itself (its own ``seconds``, wait, MFU).

        The values are recorded as given (a NaN loss too); :meth:`step` is the checked,
        self-timing way.
        """
        if not self._open("record_step"):
            return
        self._ensure_started(record.step)
        telemetry = self._telemetry
        telemetry.step(
            step=record.step, loss=record.loss, seconds=record.seconds, tokens=record.tokens
        )
        wait = record.wait_seconds
        telemetry.step_details(
            compute_seconds=None if wait is None else record.seconds - wait,
            wait_seconds=wait,
            grad_norm=record.grad_norm,
            mfu=record.mfu,
            peak_flops=record.peak_flops,
            memory=record.memory,
            sample_rss=record.sample_rss,
        )
        telemetry.extras(learning_rate=record.learning_rate, samples=record.samples)
        with self._lock:
            self._last_step = record.step

    @property
    def last_step(self) -> int | None:
        """The last step marked (``None`` before any)."""
        return self._last_step

    # ------------------------------------------------------------------ phases
    def phase(self, name: str, *, bound_seconds: float | None = None) -> PhaseContext:
        """A context manager marking phase ``name`` (see :func:`stormwatch.telemetry.phase`)."""
        spec = PHASES.get(name) if isinstance(name, str) else None
        if spec is not None and bound_seconds is not None:
            spec = checks.phase_with_bound(spec, bound_seconds)
        if spec is None:
            warn_once(
                "phase:name",
                "phase(%r): unknown phase; not marked (use one of %s)",
                name,
                ", ".join(PHASES),
            )
            return PhaseContext(None, None)
        if not self._open("phase"):
            return PhaseContext(None, None)
        return PhaseContext(self, spec)

    @never_raises()
    def _enter_phase(self, spec: PhaseSpec) -> None:
        given = spec.bound_seconds if spec is not PHASES[spec.name] else None  # for this entry
        bound = self.settings.phase_bound(spec.name, given=given)
        with self._lock:
            outermost = self._steps.enter(spec)
            if spec.name == "checkpoint_load" and not self._started:
                self._loaded_checkpoint = True
            self._failed_phase = None
        if outermost:
            self._telemetry.phase(spec.name, deadline=self._clock() + bound)

    @never_raises()
    def _leave_phase(self, spec: PhaseSpec, *, failed: bool = False) -> None:
        with self._lock:
            if failed and self._failed_phase is None:
                self._failed_phase = spec.name
            left = self._steps.leave(spec)
        if left:
            self._telemetry.phase(spec.name, deadline=0.0)

    # ------------------------------------------------------------------ checkpoints
    @never_raises()
    def checkpoint(self, step: int, *, error: str | BaseException | None = None) -> None:
        """A checkpoint of ``step`` committed, or failed: :func:`stormwatch.telemetry.checkpoint`."""
        if not self._open("checkpoint"):
            return
        if step is None:
            warn_once("checkpoint:step", "checkpoint(None): the step is required (an int >= 0)")
            return
        ok, number = checks.count("step", step, call="checkpoint")
        if not ok or number is None:
            return
        self._ensure_started(None)
        if error is None:
            self._telemetry.checkpoint(step=number)
        elif not self._telemetry.save_cut_short(number, error):
            self._telemetry.checkpoint_failed(step=number, error=checks.error_text(error))

    @never_raises()
    def checkpoint_interval(self, steps: int) -> None:
        """Export the steps between checkpoints (0: checkpointing is off)."""
        ok, number = checks.count("steps", steps, call="checkpoint_interval")
        if ok and number is not None and self._open("checkpoint_interval"):
            self._telemetry.checkpoint_interval(number)

    # ------------------------------------------------------------------ collectives
    @never_raises()
    def instrument_collectives(self) -> None:
        """Count c10d collectives from now on (idempotent); see
        :func:`stormwatch.telemetry.instrument_collectives`."""
        if self._open("instrument_collectives"):
            self._collectives.instrument(self._rendezvous, self._count_always)

    def _rendezvous(self) -> contextlib.AbstractContextManager[Any]:
        """The ``rendezvous`` phase around ``init_process_group`` (nothing once shut down)."""
        if self._closed:
            return contextlib.nullcontext()
        return self.phase("rendezvous")

    @never_raises()
    def _count_always(self) -> None:
        if not self._closed:
            self._collectives.always()

    def _counter_made(self, counter: Any) -> None:
        self._dumper.recent = counter.recent

    def collective_counter(self) -> Any:
        """The session's :class:`~stormwatch.telemetry.CollectiveCounter` (made on first
        use, not entered): for a job that counts chosen blocks itself (``with counter:``)
        instead of every collective (``init(collectives=False)``)."""
        return self._collectives.counter()

    @never_raises()
    def label_mesh(self, mesh: Any) -> None:
        """Label collectives by the dimension names of ``mesh`` (a ``DeviceMesh`` built with
        ``mesh_dim_names``): ``mesh_dim="dp_shard"``, ``"tp"``... instead of ``world``/``other``."""
        self._collectives.label_mesh(mesh)

    @never_raises()
    def label_groups(self, groups: Mapping[str, str]) -> None:
        """Label collectives by process-group name -> mesh dimension name."""
        self._collectives.label(groups)

    # ------------------------------------------------------------------ chaos and errors
    @never_raises()
    def fault(self, point: str, step: int) -> None:
        """A chaos fault point took effect during ``step`` (event and counter, once per
        point and step)."""
        if self._open("fault"):
            self._telemetry.fault(point=point, step=step)

    @never_raises()
    def report_error(self, sink: str, exc: BaseException) -> None:
        """Count a failure of the job's own telemetry (``sink``: ``control``, ``tracing``...)
        in ``stormwatch_train_telemetry_errors_total``; logged like the session's own."""
        self._telemetry.on_error(sink, exc)

    @never_raises()
    def dump(self, reason: str | BaseException, *, requested: bool = False) -> Path | None:
        """Write this rank's post-mortem dump now (``reason``: a text, or the exception that
        ended training, with its errno; ``requested``: a dump request's answer, in a file of
        its own); its path, or ``None``. Collectives seen complete are counted first."""
        counter = self._collectives.made()
        if counter is not None:
            with contextlib.suppress(Exception):  # the dump matters more than this report
                counter.poll()
        last = self._last_step if self._last_step is not None else self._resumed
        self._dumper.step = (last or 0) + 1 if self._started else None
        with self._lock:
            self._dumper.phase = self._steps.innermost() or self._failed_phase
        return self._dumper.dump(reason, requested=requested)

    # ------------------------------------------------------------------ spans
    @never_raises()
    def trace(
        self,
        *,
        otlp_endpoint: str | None = None,
        spans_dir: str | os.PathLike[str] | None = None,
        flush_timeout: float = 2.0,
    ) -> None:
        """Export this rank's OpenTelemetry spans (:meth:`span`): over OTLP/HTTP to
        ``otlp_endpoint`` (else the standard ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``; needs
        ``opentelemetry-exporter-otlp-proto-http``), else as JSON lines to
        ``<spans_dir>/rank<R>.jsonl``; flushed at :meth:`shutdown` within ``flush_timeout``
        seconds (spans not exported by then are counted as ``tracing`` errors). Resource
        attributes: ``rank``, ``job``, ``attempt``. Once per session."""
        if not self._open("trace") or self._spans.started:
            return
        self._spans.start(
            otlp_endpoint=otlp_endpoint,
            spans_dir=None if spans_dir is None else Path(spans_dir),
            flush_timeout=flush_timeout,
            rank=self.rank,
            attributes={"job": self.job, "attempt": self.attempt},
        )

    def span(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
        """``with session.span(name, **attributes):`` a span around the block (nested spans
        are its children); a no-op without :meth:`trace`. The block's exceptions pass."""
        return self._spans.span(name, **attributes)

    # ------------------------------------------------------------------ the end
    @never_raises()
    def shutdown(self, *, clean: bool = True) -> None:
        """End the session: stop counting, write the done record and marker when
        ``clean``, flush the spans, close the event log. Later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(Exception):  # a failed final poll is not worth a warning
            self._collectives.stop()
        if self._requests is not None:
            self._requests.stop(timeout=0.0)  # a daemon: it need not be waited for
        if clean:
            self._ensure_started(None)
            last = self._last_step if self._last_step is not None else self._resumed
            self._telemetry.done(step=last)
        self._spans.close()
        self._telemetry.close()
        self._exits.uninstall()

    def _forget_in_child(self) -> None:  # a forked child is not the rank: nothing from it
        self._closed = True
        for watch in (self._sigterm, self._stop_watch):
            watch.forget_in_child()
        self._exits.forget_in_child()

    def _at_exit(self, clean: bool) -> None:
        # after SIGTERM the end is not clean, whatever the handler it chained to did
        self.shutdown(clean=clean and not self._signalled)

    def _on_signal(self, signum: int) -> None:
        self._sigterm.answered()
        self._sigterm.dump_once("written by the API's handler")
        # what the flusher holds, before a default action ends the process without atexit
        self._telemetry.flush_on_signal()

    @never_raises()
    def stop_requested(self) -> None:
        """The rank was asked to stop (SIGTERM): the agent counts its exit as a stop, and
        the ``stopping`` phase excuses its pause (:mod:`stormwatch.telemetry.phases`). Safe
        in a SIGTERM handler (:meth:`RankTelemetry.stop_requested`). The API's SIGTERM
        handling calls it, and without ``handle_signals`` a thread woken by it (:mod:`.sigterm`)."""
        bound = self.settings.phase_bound("stopping")
        self._telemetry.stop_requested(deadline=self._clock() + bound)

    def _signal_dump(self, reason: str) -> None:
        self._signalled = True
        self.stop_requested()
        self.dump(reason)


__all__ = ["PhaseContext", "Session", "StepRecord"]
