"""One rank's telemetry: metrics, event log and done marker behind one guard.

:class:`RankTelemetry` is what the training loop talks to. Per step and per collective it
only records in memory (the metrics deferred, :mod:`stormwatch.telemetry.handoff.metric_writes`;
step records queued, :class:`~stormwatch.telemetry.events.EventLog`); its
:class:`~stormwatch.telemetry.handoff.flusher.Flusher` thread writes them every 0.1 s. The rare
records that must be visible at once (start, phases, checkpoints, fault points, the
stop request, done) flush on the calling thread, after what was queued. Every call is
guarded: a failing sink (full disk, unwritable folder, bad value) is logged
at WARNING (first failure per sink, then every 100th), counted in
:attr:`RankTelemetry.errors` and in ``stormwatch_train_telemetry_errors_total``
when metrics still work, and never raised into training. It also is the
:class:`~stormwatch.telemetry.comms.CollectiveSink` of the collective counter.
No torch import here.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from stormwatch.telemetry.events import EventLog
from stormwatch.telemetry.failures import lost_peer
from stormwatch.telemetry.handoff.flusher import Flusher
from stormwatch.telemetry.handoff.tally import CollectiveTally
from stormwatch.telemetry.lifecycle.steps import rss_bytes
from stormwatch.telemetry.metrics import COLLECTIVE_LATENCY_BUCKETS, RankMetrics
from stormwatch.telemetry.perf import bus_factor, collective_size

if TYPE_CHECKING:
    from stormwatch.telemetry.comms import CollectiveRecord

log = logging.getLogger(__name__)

_LOG_EVERY = 100
#: Seconds; the progress heartbeat advanced by completed collectives is written at most
#: this often (a write per collective would cost ~2 us each for nothing: the agent scans
#: every 0.5 s and the stall threshold is at least 5 s).
HEARTBEAT_RESOLUTION = 0.5
#: Seconds between reads of the process's RSS when every step asks for it (a read is two
#: /proc reads on the flusher's thread; a memory gauge a second old says as much).
RSS_INTERVAL = 1.0


class RankOutputs(Protocol):
    """Where one rank's telemetry goes: the job label and the output folders (``None``: off).

    The trainer's ``TelemetryConfig`` and the session's settings
    (:class:`stormwatch.telemetry.lifecycle.launch.Settings`) both have these.
    """

    @property
    def job(self) -> str: ...

    @property
    def metrics_dir(self) -> Path | None: ...

    @property
    def log_dir(self) -> Path | None: ...


def done_marker_path(metrics_dir: Path, rank: int) -> Path:
    """``<metrics_dir>/rank<rank>.done``: touched when a rank finished cleanly."""
    return metrics_dir / f"rank{rank}.done"


def stop_marker_path(metrics_dir: Path, rank: int) -> Path:
    """``<metrics_dir>/rank<rank>.stopping``: touched when the rank got SIGTERM (asked to
    stop). The agent counts an exit of a process that touched it during its life as a stop
    (``reason="stopped"``), not an unexpected exit, whatever its exit status: a stop that
    ends in SIGKILL at the end of the scheduler's grace period is still a stop."""
    return metrics_dir / f"rank{rank}.stopping"


class RankTelemetry:
    """Metrics + event log + done marker for one rank; never raises from its methods.

    Args:
        config: job name and output folders (``None`` folders disable that output).
        rank: global rank.
        world_size: ranks in the job.
        attempt: torchrun restart count (TORCHELASTIC_RESTART_COUNT; node-local, the job's
            attempt is :meth:`job_attempt`'s).
        clock: Unix time source.
    """

    def __init__(
        self,
        config: RankOutputs,
        *,
        rank: int,
        world_size: int,
        attempt: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._rank = rank
        self._clock = clock
        self.errors: collections.Counter[str] = collections.Counter()
        self._metrics: RankMetrics | None = None
        self._events: EventLog | None = None
        # every collective, in plain numbers until the flusher's turn (and this step's)
        self._tally = CollectiveTally(COLLECTIVE_LATENCY_BUCKETS)
        self._lock = threading.Lock()
        self._fault_step = -1
        self._faults_seen: set[str] = set()  # points recorded in step _fault_step
        self._progress_at = 0.0  # Unix time of the last heartbeat recorded
        self._rss_wanted = False  # a step asked for the RSS: the flusher reads it
        self._rss_next = 0.0  # monotonic time of the next RSS read (RSS_INTERVAL apart)
        self._events_dropped = 0  # step records dropped, already counted as errors
        self._stopping = False  # asked to stop (SIGTERM): a save cut short is not failed
        if config.metrics_dir is not None:
            self._metrics = self._guard(
                "metrics",
                RankMetrics,
                config.metrics_dir,
                job=config.job,
                rank=rank,
                deferred=True,
            )
            if self._metrics is not None:
                self._guard(
                    "metrics",
                    self._metrics.job_info,
                    world_size=world_size,
                    node_restarts=attempt,
                )
        if config.log_dir is not None:
            self._events = self._guard(
                "events",
                EventLog,
                config.log_dir,
                rank=rank,
                attempt=attempt,
                clock=clock,
                world_size=world_size,
                deferred=True,
            )
        self._flusher = Flusher(
            (("metrics", self._flush_metrics), ("events", self._flush_events)),
            on_error=self._failed,
        )
        self._flusher.start()
        self._flush()

    def _flush_metrics(self) -> None:
        metrics = self._metrics
        if metrics is None:
            return
        ops, latencies = self._tally.take()
        for op in ops:
            metrics.collective_totals(
                op=op.op, calls=op.calls, nbytes=op.nbytes, seconds=op.seconds
            )
        for dim in latencies:
            metrics.collective_latencies(
                mesh_dim=dim.mesh_dim,
                op=dim.op,
                size=dim.size,
                buckets=dim.buckets,
                total=dim.total,
            )
        if self._rss_wanted and (now := time.monotonic()) >= self._rss_next:
            self._rss_wanted, self._rss_next = False, now + RSS_INTERVAL
            for kind, nbytes in rss_bytes().items():
                metrics.memory(kind=kind, nbytes=nbytes)
        metrics.flush()

    def _flush_events(self) -> None:
        if self._events is None:
            return
        try:
            self._events.flush()
        finally:
            dropped = self._events.dropped - self._events_dropped
            if dropped > 0:
                self._events_dropped += dropped
                full = RuntimeError(
                    f"{dropped} step records dropped: the event log's queue was full"
                )
                self._failed("events", full, dropped)

    def _flush(self) -> None:
        """Write what is recorded now, on the calling thread (a record that must be seen)."""
        self._flusher.flush()

    def _guard(self, sink: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            self._failed(sink, exc)
            return None

    def _failed(self, sink: str, exc: BaseException, count: int = 1) -> None:
        """``count`` failures of ``sink`` (logged on the first and every 100th)."""
        before = self.errors[sink]
        self.errors[sink] += count
        if before == 0 or before // _LOG_EVERY != self.errors[sink] // _LOG_EVERY:
            log.warning(
                "telemetry sink %s failed (%d failures so far; training continues): %s",
                sink,
                self.errors[sink],
                exc,
                exc_info=before == 0,
            )
        if self._metrics is not None and sink != "metrics":
            try:
                self._metrics.telemetry_error(sink, count)
            except Exception:
                self.errors["metrics"] += 1

    def start(self, *, resumed_from_step: int | None) -> None:
        """Log the start record, set the step gauge and heartbeat, remove stale done and stop
        markers."""
        if self._config.metrics_dir is not None:
            for marker in (
                done_marker_path(self._config.metrics_dir, self._rank),
                stop_marker_path(self._config.metrics_dir, self._rank),
            ):
                self._guard("done_marker", marker.unlink, missing_ok=True)
        if self._metrics is not None:
            self._guard(
                "metrics",
                self._metrics.started,
                step=resumed_from_step or 0,
                timestamp=self._clock(),
            )
        if self._events is not None:
            self._guard("events", self._events.start, resumed_from_step=resumed_from_step)
        self._flush()

    def job_attempt(self, attempt: int, *, failed_nodes: tuple[str, ...] = ()) -> None:
        """The job attempt every rank agreed (:mod:`stormwatch.telemetry.restarts`) and the
        nodes whose failure caused it: into the metric and the coming start record."""
        if self._metrics is not None:
            self._guard("metrics", self._metrics.job_attempt, attempt)
        if self._events is not None:
            self._events.job_attempt(attempt, failed_nodes=failed_nodes)
        self._flush()

    def step(self, *, step: int, loss: float | None, seconds: float, tokens: int | None) -> None:
        """Record a completed step (global mean ``loss``, wall ``seconds``, ``tokens``;
        ``None``: not reported); in memory, written by the flusher within 0.1 s."""
        if self._metrics is not None:
            self._guard(
                "metrics",
                self._metrics.step,
                step=step,
                loss=loss,
                seconds=seconds,
                tokens=tokens,
                timestamp=self._clock(),
            )
        if self._events is not None:
            self._guard("events", self._events.step, step=step, loss=loss, step_seconds=seconds)

    def progress(self, *, force: bool = True, ago: float = 0.0) -> None:
        """Advance the progress heartbeat to now, or to ``ago`` seconds before now (progress
        noticed late); never backwards. With ``force=False`` at most every
        :data:`HEARTBEAT_RESOLUTION` seconds (what each completed collective calls)."""
        if self._metrics is None:
            return
        at = self._clock() - max(0.0, ago)
        if at <= self._progress_at:
            return
        if not force and at - self._progress_at < HEARTBEAT_RESOLUTION:
            return
        self._progress_at = at
        self._guard("metrics", self._metrics.progress, at)

    def phase(self, name: str, *, deadline: float) -> None:
        """Phase ``name`` may pause progress until Unix time ``deadline`` (0: left it);
        a phase boundary is progress too."""
        if self._metrics is not None:
            self._guard("metrics", self._metrics.phase, name, deadline=deadline)
        self.progress()
        self._flush()

    def extras(self, *, learning_rate: float | None, samples: int | None) -> None:
        """The step's learning rate and samples (``None``: not reported)."""
        if self._metrics is None:
            return
        if learning_rate is not None:
            self._guard("metrics", self._metrics.learning_rate, learning_rate)
        if samples is not None:
            self._guard("metrics", self._metrics.samples, samples)

    def step_details(
        self,
        *,
        compute_seconds: float | None,
        wait_seconds: float | None,
        grad_norm: float | None = None,
        mfu: float | None = None,
        peak_flops: float | None = None,
        memory: Mapping[str, int] | None = None,
        sample_rss: bool = False,
    ) -> None:
        """Record the per-step breakdown; call after :meth:`step` for the same step.

        Args:
            compute_seconds: step wall time outside collectives (``None`` with
                ``wait_seconds``: collectives are not counted, no breakdown exported).
            wait_seconds: step wall time with a collective in flight.
            grad_norm: global gradient L2 norm.
            mfu: model FLOPs utilisation (0..1) against ``peak_flops`` FLOP/s.
            memory: kind (``rss``, ``cuda_max_allocated``) -> bytes.
            sample_rss: the flusher reads this process's RSS into ``memory{kind="rss"}``
                (off the training thread, at most every :data:`RSS_INTERVAL` seconds: the
                first request at once, later ones within a second).

        Also sets the algbw/busbw gauges from the collectives seen since the
        previous call (see :mod:`stormwatch.telemetry.perf`).
        """
        collectives = self._tally.take_step()
        if self._metrics is None:
            return
        metrics = self._metrics
        if compute_seconds is not None and wait_seconds is not None:
            self._guard(
                "metrics",
                metrics.breakdown,
                compute_seconds=compute_seconds,
                wait_seconds=wait_seconds,
            )
        for (mesh_dim, op), (size, seconds, n) in collectives.items():
            factor = bus_factor(op, n)
            if seconds > 0 and size > 0:
                algbw = size / seconds
                self._guard(
                    "metrics",
                    metrics.bandwidth,
                    mesh_dim=mesh_dim,
                    op=op,
                    algbw=algbw,
                    busbw=algbw * factor,
                )
        if grad_norm is not None:
            self._guard("metrics", metrics.grad_norm, grad_norm)
        if mfu is not None and peak_flops is not None:
            self._guard("metrics", metrics.mfu, ratio=mfu, peak_flops=peak_flops)
        for kind, nbytes in (memory or {}).items():
            self._guard("metrics", metrics.memory, kind=kind, nbytes=nbytes)
        if sample_rss:
            self._rss_wanted = True

    def fault(self, *, point: str, step: int) -> None:
        """A chaos fault point took effect during ``step`` (recorded once per point and step)."""
        with self._lock:
            if step != self._fault_step:
                self._fault_step, self._faults_seen = step, set()
            if point in self._faults_seen:
                return
            self._faults_seen.add(point)
        log.info("fault point %s took effect in step %d", point, step)
        if self._metrics is not None:
            self._guard("metrics", self._metrics.fault, point)
        if self._events is not None:
            self._guard("events", self._events.fault, point=point, step=step)
        self._flush()

    def checkpoint(self, *, step: int) -> None:
        """Record a complete checkpoint of ``step`` (event and last-checkpoint timestamp)."""
        if self._metrics is not None:
            self._guard("metrics", self._metrics.checkpoint_committed, timestamp=self._clock())
        if self._events is not None:
            self._guard("events", self._events.checkpoint, step=step)
        self.progress()
        self._flush()

    def save_cut_short(self, step: int, error: str | BaseException) -> bool:
        """Whether the save of ``step`` that failed with ``error`` was cut short by the job
        ending, not failed: the rank was asked to stop (:meth:`stop_requested`), or
        ``error`` says a peer was lost (:func:`~stormwatch.telemetry.failures.lost_peer`).
        Such a save is logged, not counted: counting it fired StormwatchCheckpointFailing
        after planned restarts and elastic resizes of fault-free jobs."""
        lost = None if isinstance(error, str) else lost_peer(error)
        if not (self._stopping or lost is not None):
            return False
        why = "a stop request" if self._stopping else f"a lost peer ({lost})"
        log.info("the save of step %d was cut short by %s: not a failed save", step, why)
        return True

    def checkpoint_failed(self, *, step: int, error: str) -> None:
        """Record a failed checkpoint save after ``step`` (counter and event)."""
        if self._metrics is not None:
            self._guard("metrics", self._metrics.checkpoint_failed)
        if self._events is not None:
            self._guard("events", self._events.checkpoint_failed, step=step, error=error)
        self.progress()
        self._flush()

    def stop_requested(self, *, deadline: float) -> None:
        """The rank was asked to stop (SIGTERM): write its pid to
        ``<metrics-dir>/rank<R>.stopping`` now, and enter the ``stopping`` phase until Unix
        time ``deadline`` from a thread. Safe in a signal handler: the marker is a plain
        file write, and the phase, a metric whose lock the interrupted code may hold, is
        set once the handler has returned. The agent reads the pid, so another job's rank
        of the same number in the same folder is not taken for this one."""
        self._stopping = True
        if self._config.metrics_dir is not None:
            marker = stop_marker_path(self._config.metrics_dir, self._rank)
            self._guard("done_marker", marker.write_text, f"{os.getpid()}\n")
        threading.Thread(
            target=self.phase,
            args=("stopping",),
            kwargs={"deadline": deadline},
            name="stormwatch-stopping",
            daemon=True,
        ).start()

    def checkpoint_interval(self, steps: int) -> None:
        """Export the checkpoint interval in steps (0 when checkpointing is off)."""
        if self._metrics is not None:
            self._guard("metrics", self._metrics.checkpoint_interval, steps)
        self._flush()

    def done(self, *, step: int | None) -> None:
        """Log the done record, write every recorded metric, then touch
        ``<metrics-dir>/rank<R>.done``."""
        if self._events is not None:
            self._guard("events", self._events.done, step=step)
        self._flush()
        if self._config.metrics_dir is not None:
            marker = done_marker_path(self._config.metrics_dir, self._rank)
            self._guard("done_marker", marker.touch)

    def flush(self) -> None:
        """Write everything recorded so far now, on the calling thread (a SIGTERM's dump,
        the end of the session)."""
        self._flush()

    def flush_on_signal(self, timeout: float = 1.0) -> None:
        """Write everything recorded so far from a signal handler: on a helper thread,
        waited for at most ``timeout`` seconds (the interrupted code may hold a lock)."""
        if not self._flusher.flush_within(timeout):
            log.warning("telemetry flush on SIGTERM did not finish within %.1f s", timeout)

    def close(self) -> None:
        """Stop the flusher after a last round (nothing recorded is left unwritten), then
        close the event log. Later records are written at once (no thread)."""
        self._flusher.stop()
        if self._metrics is not None:
            self._metrics.deferred = False
        if self._events is not None:
            self._events.deferred = False
            self._guard("events", self._events.close)

    # CollectiveSink: plain numbers on the issuing thread, written by the flusher
    def on_issue(self, op: str, nbytes: int) -> None:
        if self._metrics is not None:
            self._tally.issued(op, nbytes)

    def on_complete(self, op: str, seconds: float, ago: float = 0.0) -> None:
        if self._metrics is not None:
            self._tally.completed(op, seconds)
            self.progress(force=False, ago=ago)

    def on_error(self, where: str, exc: BaseException) -> None:
        self._failed(where, exc)

    # CollectiveObserver
    def on_collective(self, record: CollectiveRecord) -> None:
        if self._metrics is None:
            return
        try:
            size = collective_size(record.op, record.nbytes, record.group_size)
            self._tally.observed(
                record.mesh_dim,
                record.op,
                size=size,
                seconds=record.seconds,
                group=record.group_size,
            )
        except Exception as exc:
            self._failed("metrics", exc)


__all__ = [
    "HEARTBEAT_RESOLUTION",
    "RankOutputs",
    "RankTelemetry",
    "done_marker_path",
    "stop_marker_path",
]
