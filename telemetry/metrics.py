"""Per-rank Prometheus metrics, written as prometheus-client multiprocess files.

The catalogue (names, types, help) is :data:`CATALOGUE`; it follows
docs/ARCHITECTURE.md "Trainer -> agent telemetry". Every metric carries the
labels ``training_job`` (:data:`~stormwatch.contracts.labels.TRAINING_JOB_LABEL`, the
job's name; not ``job``, which Prometheus owns) and ``rank``; the collective counters also
carry ``op`` (see :data:`stormwatch.telemetry.comms.OP_LABELS`).

Multiprocess mode is switched on here, explicitly, before any metric is
created: :class:`RankMetrics` points ``PROMETHEUS_MULTIPROC_DIR`` at the
metrics folder (prometheus-client reads it when it opens a file) and installs
``prometheus_client.values.MultiProcessValue()`` as the value class, so
nothing depends on the environment at import time. This is process-wide
state; a trainer rank creates one :class:`RankMetrics`.

State gauges use ``multiprocess_mode="livemax"``: one process writes each
``(training_job, rank)`` series, so the max is that process's value, and the agent's
``mark_process_dead(pid)`` deletes the file of a rank that exited (FC-01).
Counters and histograms are never deleted.

A training rank's :class:`RankMetrics` is ``deferred``: its updates are plain numbers in
memory until a flush writes them (:mod:`stormwatch.telemetry.handoff.metric_writes`, from the
rank's flusher thread, :mod:`stormwatch.telemetry.handoff.flusher`); names, labels and values
are those of the same updates written one by one. No torch import here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram, values

from stormwatch.contracts.labels import TRAINING_JOB_LABEL
from stormwatch.telemetry.handoff.metric_writes import MetricWriter


@dataclass(frozen=True)
class MetricSpec:
    """One row of the metric catalogue."""

    name: str
    kind: str  # "gauge" | "counter" | "histogram"
    help: str
    labels: tuple[str, ...] = (TRAINING_JOB_LABEL, "rank")
    buckets: tuple[float, ...] | None = None  # histograms; None: STEP_DURATION_BUCKETS


#: Seconds; one collective: 10 us (small CPU op) to 2 minutes (a stuck peer).
COLLECTIVE_LATENCY_BUCKETS = (
    1e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120,
)  # fmt: skip

_COLL = (TRAINING_JOB_LABEL, "rank", "mesh_dim", "op")

#: Every metric a trainer rank exports. Counters are named without the
#: ``_total`` suffix that prometheus-client appends.
CATALOGUE: tuple[MetricSpec, ...] = (
    MetricSpec("stormwatch_train_step", "gauge", "Last completed training step."),
    MetricSpec(
        "stormwatch_train_last_step_timestamp_seconds",
        "gauge",
        "Unix time at which the last step completed, or the rank started (heartbeat).",
    ),
    MetricSpec(
        "stormwatch_train_last_progress_timestamp_seconds",
        "gauge",
        "Unix time of the rank's last sign of progress: a step, a completed collective, a "
        "phase boundary or a checkpoint (heartbeat; advances without step marks too).",
    ),
    MetricSpec(
        "stormwatch_train_phase_deadline_timestamp_seconds",
        "gauge",
        "Unix time until which the rank may pause progress in this phase without being "
        "called hung (entry + the phase's bound); 0 when not in the phase.",
        (TRAINING_JOB_LABEL, "rank", "phase"),
    ),
    MetricSpec("stormwatch_train_loss", "gauge", "Loss of the last step, mean over dp ranks."),
    MetricSpec(
        "stormwatch_train_step_duration_seconds",
        "histogram",
        "Wall time of one training step (forward, backward, optimizer, loss all-reduce).",
    ),
    MetricSpec(
        "stormwatch_train_tokens_per_second",
        "gauge",
        "Tokens of this rank's data-parallel replica per second in the last step.",
    ),
    MetricSpec(
        "stormwatch_train_learning_rate", "gauge", "Learning rate of the last step (as reported)."
    ),
    MetricSpec(
        "stormwatch_train_samples",
        "counter",
        "Samples (sequences, images) processed by this rank's data-parallel replica.",
    ),
    MetricSpec("stormwatch_train_world_size", "gauge", "Number of ranks in the job."),
    MetricSpec(
        "stormwatch_train_node_restarts",
        "gauge",
        "Restarts of this node's worker group (TORCHELASTIC_RESTART_COUNT; node-local: a "
        "node restarted only because a peer failed does not count it).",
    ),
    MetricSpec(
        "stormwatch_train_job_restarts",
        "gauge",
        "Restarts of the whole job so far, agreed by every rank at start-up "
        "(stormwatch.telemetry.restarts); the node count until agreed.",
    ),
    MetricSpec("stormwatch_train_steps", "counter", "Training steps completed by this rank."),
    MetricSpec(
        "stormwatch_train_tokens",
        "counter",
        "Tokens processed by this rank's data-parallel replica.",
    ),
    MetricSpec(
        "stormwatch_collective_calls",
        "counter",
        "Collectives issued during training steps.",
        (TRAINING_JOB_LABEL, "rank", "op"),
    ),
    MetricSpec(
        "stormwatch_collective_bytes",
        "counter",
        "Input bytes of the collectives issued during training steps.",
        (TRAINING_JOB_LABEL, "rank", "op"),
    ),
    MetricSpec(
        "stormwatch_collective_duration_seconds",
        "counter",
        "Seconds from issue to observed completion of collectives (overlapping ops overlap).",
        (TRAINING_JOB_LABEL, "rank", "op"),
    ),
    MetricSpec(
        "stormwatch_collective_latency_seconds",
        "histogram",
        "Issue-to-completion latency of one collective, by mesh dimension (pp, dp_replicate, dp_shard, tp, world) and op.",
        _COLL,
        COLLECTIVE_LATENCY_BUCKETS,
    ),
    MetricSpec(
        "stormwatch_collective_size_bytes",
        "counter",
        "nccl-tests size S of the collectives (full buffer: all_gather output, others input).",
        _COLL,
    ),
    MetricSpec(
        "stormwatch_collective_algbw_bytes_per_second",
        "gauge",
        "Algorithm bandwidth S/t of the last step's collectives (nccl-tests definition).",
        _COLL,
    ),
    MetricSpec(
        "stormwatch_collective_busbw_bytes_per_second",
        "gauge",
        "Bus bandwidth algbw x op factor of the last step's collectives (nccl-tests definition).",
        _COLL,
    ),
    MetricSpec(
        "stormwatch_train_step_compute_seconds",
        "gauge",
        "Last step's wall time outside collectives (step time minus collective wait).",
    ),
    MetricSpec(
        "stormwatch_train_step_collective_wait_seconds",
        "gauge",
        "Last step's wall time with at least one collective in flight on this rank.",
    ),
    MetricSpec(
        "stormwatch_train_compute_seconds",
        "counter",
        "Step wall time outside collectives (low on ranks that wait for a straggler).",
    ),
    MetricSpec(
        "stormwatch_train_collective_wait_seconds",
        "counter",
        "Step wall time spent waiting in collectives (lowest on a compute straggler, FC-14).",
    ),
    MetricSpec(
        "stormwatch_train_grad_norm", "gauge", "Global L2 norm of the last step's gradients."
    ),
    MetricSpec(
        "stormwatch_train_mfu_ratio",
        "gauge",
        "Model FLOPs utilisation of this rank's device in the last step (0..1).",
    ),
    MetricSpec(
        "stormwatch_train_peak_flops_per_second",
        "gauge",
        "Peak FLOP/s of one device used as the MFU denominator (table or --peak-flops).",
    ),
    MetricSpec(
        "stormwatch_train_memory_bytes",
        "gauge",
        "Memory of this rank (kind: rss on CPU, cuda_max_allocated on GPU).",
        (TRAINING_JOB_LABEL, "rank", "kind"),
    ),
    MetricSpec(
        "stormwatch_train_last_checkpoint_timestamp_seconds",
        "gauge",
        "Unix time at which this rank's last checkpoint was committed (complete on disk).",
    ),
    MetricSpec(
        "stormwatch_train_checkpoint_interval_steps",
        "gauge",
        "Steps between checkpoints (--checkpoint-every); 0 when checkpointing is off.",
    ),
    MetricSpec(
        "stormwatch_train_checkpoint_failures",
        "counter",
        "Checkpoint saves that failed on this rank's job (every rank counts each failed save; "
        "training went on within --checkpoint-failures-allowed).",
    ),
    MetricSpec(
        "stormwatch_train_fault_injections",
        "counter",
        "Steps in which a chaos fault point took effect on this rank (by point).",
        (TRAINING_JOB_LABEL, "rank", "point"),
    ),
    MetricSpec(
        "stormwatch_train_telemetry_errors",
        "counter",
        "Telemetry writes that failed (sink: metrics, events, collectives, done_marker, control).",
        (TRAINING_JOB_LABEL, "rank", "sink"),
    ),
)

#: Seconds; spans a 5 ms CPU step to a 2-minute stalled one.
STEP_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def enable_multiprocess(metrics_dir: Path) -> None:
    """Point prometheus-client's value class at per-process files in ``metrics_dir``.

    Creates the folder. Must run before the first metric object is created.
    """
    metrics_dir.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    values.ValueClass = values.MultiProcessValue()


class RankMetrics:
    """The catalogue's metrics for one ``(job, rank)``, in multiprocess files.

    Args:
        metrics_dir: the node's metrics folder (created if missing).
        job: the job's name, the ``training_job`` label's value.
        rank: global rank (``rank`` label value).
        deferred: hold every update in memory until :meth:`flush`
            (:mod:`stormwatch.telemetry.handoff.metric_writes`; what a training rank does, with a
            background :class:`~stormwatch.telemetry.handoff.flusher.Flusher`); ``False``: each
            update is written at once.

    Raises:
        OSError: the folder cannot be created or written.
    """

    def __init__(self, metrics_dir: Path, *, job: str, rank: int, deferred: bool = False) -> None:
        enable_multiprocess(metrics_dir)
        self.metrics_dir = metrics_dir
        made: dict[str, Gauge | Counter | Histogram] = {}
        for spec in CATALOGUE:
            if spec.kind == "gauge":
                made[spec.name] = Gauge(
                    spec.name,
                    spec.help,
                    spec.labels,
                    multiprocess_mode="livemax",
                    registry=None,
                )
            elif spec.kind == "counter":
                made[spec.name] = Counter(spec.name, spec.help, spec.labels, registry=None)
            else:
                made[spec.name] = Histogram(
                    spec.name,
                    spec.help,
                    spec.labels,
                    buckets=spec.buckets or STEP_DURATION_BUCKETS,
                    registry=None,
                )
        self._w = MetricWriter(made, (job, str(rank)), deferred=deferred)

    @property
    def pending(self) -> bool:
        """Whether updates wait for :meth:`flush` (deferred mode)."""
        return self._w.pending

    @property
    def deferred(self) -> bool:
        """Whether updates wait for :meth:`flush`; set ``False`` to write them at once
        again (what is pending is written first)."""
        return self._w.deferred

    @deferred.setter
    def deferred(self, value: bool) -> None:
        if not value:
            self._w.flush()
        self._w.deferred = value

    def flush(self) -> None:
        """Write the deferred updates into the files now (any thread).

        Raises:
            Exception: what prometheus-client raised (a full disk).
        """
        self._w.flush()

    def job_info(self, *, world_size: int, node_restarts: int) -> None:
        """Set the gauges that describe the job (once per process); the job attempt is
        the node's count until :meth:`job_attempt` sets the agreed one."""
        self._w.set("stormwatch_train_world_size", world_size)
        self._w.set("stormwatch_train_node_restarts", node_restarts)
        self._w.set("stormwatch_train_job_restarts", node_restarts)

    def job_attempt(self, attempt: int) -> None:
        """The job attempt every rank agreed (:mod:`stormwatch.telemetry.restarts`)."""
        self._w.set("stormwatch_train_job_restarts", attempt)

    def started(self, *, step: int, timestamp: float) -> None:
        """The rank is ready to train from ``step`` (0 or the resumed step).

        Sets the step and the heartbeat so that a rank that hangs before its
        first step goes stale instead of having no series at all.
        """
        self._w.set("stormwatch_train_step", step)
        self._w.set("stormwatch_train_last_step_timestamp_seconds", timestamp)
        self.progress(timestamp)

    def step(
        self,
        *,
        step: int,
        loss: float | None,
        seconds: float,
        tokens: int | None,
        timestamp: float,
    ) -> None:
        """Record one completed step (``seconds`` > 0 wall time, ``tokens`` processed;
        ``None``: not reported, the loss gauge and token counters are left alone)."""
        w = self._w
        w.set("stormwatch_train_step", step)
        if loss is not None:
            w.set("stormwatch_train_loss", loss)
        w.set("stormwatch_train_last_step_timestamp_seconds", timestamp)
        self.progress(timestamp)
        if seconds > 0 and tokens is not None:
            w.set("stormwatch_train_tokens_per_second", tokens / seconds)
        w.observe("stormwatch_train_step_duration_seconds", seconds)
        w.inc("stormwatch_train_steps", 1)
        if tokens is not None:
            w.inc("stormwatch_train_tokens", tokens)

    def progress(self, timestamp: float) -> None:
        """The rank showed progress at Unix time ``timestamp`` (the heartbeat)."""
        self._w.set("stormwatch_train_last_progress_timestamp_seconds", timestamp)

    def phase(self, name: str, *, deadline: float) -> None:
        """Set phase ``name``'s deadline (Unix time; 0: not in the phase)."""
        self._w.set("stormwatch_train_phase_deadline_timestamp_seconds", deadline, name)

    def learning_rate(self, value: float) -> None:
        """Set the last step's learning rate."""
        self._w.set("stormwatch_train_learning_rate", value)

    def samples(self, count: int) -> None:
        """Count ``count`` samples of the last step."""
        self._w.inc("stormwatch_train_samples", count)

    def collective_issued(self, op: str, nbytes: int) -> None:
        """Count one collective ``op`` with ``nbytes`` input bytes."""
        self._w.inc("stormwatch_collective_calls", 1, op)
        self._w.inc("stormwatch_collective_bytes", nbytes, op)

    def collective_completed(self, op: str, seconds: float) -> None:
        """Add the issue-to-completion time of one collective ``op``."""
        self._w.inc("stormwatch_collective_duration_seconds", max(seconds, 0.0), op)

    def collective(self, *, mesh_dim: str, op: str, size: int, seconds: float) -> None:
        """One collective of nccl-tests size ``size`` bytes took ``seconds``."""
        self._w.observe("stormwatch_collective_latency_seconds", max(seconds, 0.0), mesh_dim, op)
        self._w.inc("stormwatch_collective_size_bytes", size, mesh_dim, op)

    def collective_totals(self, *, op: str, calls: int, nbytes: float, seconds: float) -> None:
        """``calls`` collectives ``op`` of ``nbytes`` input bytes in all, and ``seconds`` from
        issue to completion of those completed (what :meth:`collective_issued` and
        :meth:`collective_completed` one by one add up to)."""
        self._w.inc("stormwatch_collective_calls", calls, op)
        self._w.inc("stormwatch_collective_bytes", nbytes, op)
        self._w.inc("stormwatch_collective_duration_seconds", seconds, op)

    def collective_latencies(
        self, *, mesh_dim: str, op: str, size: float, buckets: Sequence[int], total: float
    ) -> None:
        """Completed collectives of ``(mesh_dim, op)``, counted per latency bucket of
        :data:`COLLECTIVE_LATENCY_BUCKETS` (+Inf last; non-cumulative) with latencies summing
        to ``total`` seconds and sizes to ``size`` bytes (what :meth:`collective` one by
        one adds up to)."""
        self._w.observe_many("stormwatch_collective_latency_seconds", buckets, total, mesh_dim, op)
        self._w.inc("stormwatch_collective_size_bytes", size, mesh_dim, op)

    def bandwidth(self, *, mesh_dim: str, op: str, algbw: float, busbw: float) -> None:
        """Set the last step's algorithm and bus bandwidth (bytes/s) of ``(mesh_dim, op)``."""
        self._w.set("stormwatch_collective_algbw_bytes_per_second", algbw, mesh_dim, op)
        self._w.set("stormwatch_collective_busbw_bytes_per_second", busbw, mesh_dim, op)

    def breakdown(self, *, compute_seconds: float, wait_seconds: float) -> None:
        """The last step's compute and collective-wait seconds (gauges and counters)."""
        w = self._w
        w.set("stormwatch_train_step_compute_seconds", compute_seconds)
        w.set("stormwatch_train_step_collective_wait_seconds", wait_seconds)
        w.inc("stormwatch_train_compute_seconds", max(compute_seconds, 0.0))
        w.inc("stormwatch_train_collective_wait_seconds", max(wait_seconds, 0.0))

    def grad_norm(self, value: float) -> None:
        """Set the last step's global gradient norm."""
        self._w.set("stormwatch_train_grad_norm", value)

    def mfu(self, *, ratio: float, peak_flops: float) -> None:
        """Set the last step's MFU and the peak FLOP/s it was computed against."""
        self._w.set("stormwatch_train_mfu_ratio", ratio)
        self._w.set("stormwatch_train_peak_flops_per_second", peak_flops)

    def memory(self, *, kind: str, nbytes: int) -> None:
        """Set this rank's memory of ``kind`` (``rss``, ``cuda_max_allocated``) in bytes."""
        self._w.set("stormwatch_train_memory_bytes", nbytes, kind)

    def checkpoint_committed(self, *, timestamp: float) -> None:
        """A checkpoint was committed at Unix time ``timestamp``."""
        self._w.set("stormwatch_train_last_checkpoint_timestamp_seconds", timestamp)

    def checkpoint_interval(self, steps: int) -> None:
        """Set the checkpoint interval in steps (0: off); also starts the failure counter at
        0, so that ``increase()`` sees the first failed save."""
        self._w.set("stormwatch_train_checkpoint_interval_steps", steps)
        self._w.inc("stormwatch_train_checkpoint_failures", 0)

    def checkpoint_failed(self) -> None:
        """Count one failed checkpoint save."""
        self._w.inc("stormwatch_train_checkpoint_failures", 1)

    def fault(self, point: str) -> None:
        """Count one step in which fault point ``point`` took effect."""
        self._w.inc("stormwatch_train_fault_injections", 1, point)

    def telemetry_error(self, sink: str, count: int = 1) -> None:
        """Count ``count`` failed telemetry writes of ``sink``."""
        self._w.inc("stormwatch_train_telemetry_errors", count, sink)


__all__ = [
    "CATALOGUE",
    "COLLECTIVE_LATENCY_BUCKETS",
    "STEP_DURATION_BUCKETS",
    "MetricSpec",
    "RankMetrics",
    "enable_multiprocess",
]
