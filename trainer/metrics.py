"""Per-rank Prometheus metrics, written as prometheus-client multiprocess files.

The catalogue (names, types, help) is :data:`CATALOGUE`; it follows
docs/ARCHITECTURE.md "Trainer -> agent telemetry". Every metric carries the
labels ``job`` and ``rank``; the collective counters also carry ``op`` (see
:data:`stormwatch.trainer.comms.OP_LABELS`).

Multiprocess mode is switched on here, explicitly, before any metric is
created: :class:`RankMetrics` points ``PROMETHEUS_MULTIPROC_DIR`` at the
metrics folder (prometheus-client reads it when it opens a file) and installs
``prometheus_client.values.MultiProcessValue()`` as the value class, so
nothing depends on the environment at import time. This is process-wide
state; a trainer rank creates one :class:`RankMetrics`.

State gauges use ``multiprocess_mode="livemax"``: one process writes each
``(job, rank)`` series, so the max is that process's value, and the agent's
``mark_process_dead(pid)`` deletes the file of a rank that exited (FC-01).
Counters and histograms are never deleted. No torch import here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram, values


@dataclass(frozen=True)
class MetricSpec:
    """One row of the metric catalogue."""

    name: str
    kind: str  # "gauge" | "counter" | "histogram"
    help: str
    labels: tuple[str, ...] = ("job", "rank")


#: Every metric a trainer rank exports. Counters are named without the
#: ``_total`` suffix that prometheus-client appends.
CATALOGUE: tuple[MetricSpec, ...] = (
    MetricSpec("stormwatch_train_step", "gauge", "Last completed training step."),
    MetricSpec(
        "stormwatch_train_last_step_timestamp_seconds",
        "gauge",
        "Unix time at which the last step completed, or the rank started (heartbeat).",
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
    MetricSpec("stormwatch_train_world_size", "gauge", "Number of ranks in the job."),
    MetricSpec(
        "stormwatch_train_restart_count",
        "gauge",
        "torchrun restart count of this worker group (TORCHELASTIC_RESTART_COUNT).",
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
        ("job", "rank", "op"),
    ),
    MetricSpec(
        "stormwatch_collective_bytes",
        "counter",
        "Input bytes of the collectives issued during training steps.",
        ("job", "rank", "op"),
    ),
    MetricSpec(
        "stormwatch_collective_duration_seconds",
        "counter",
        "Seconds from issue to observed completion of collectives (overlapping ops overlap).",
        ("job", "rank", "op"),
    ),
    MetricSpec(
        "stormwatch_train_telemetry_errors",
        "counter",
        "Telemetry writes that failed (sink: metrics, events, collectives, done_marker).",
        ("job", "rank", "sink"),
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
        job: ``job`` label value.
        rank: global rank (``rank`` label value).

    Raises:
        OSError: the folder cannot be created or written.
    """

    def __init__(self, metrics_dir: Path, *, job: str, rank: int) -> None:
        enable_multiprocess(metrics_dir)
        self.metrics_dir = metrics_dir
        self._labels = {"job": job, "rank": str(rank)}
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
                    buckets=STEP_DURATION_BUCKETS,
                    registry=None,
                )
        self._m = made

    def _gauge(self, name: str) -> Gauge:
        metric = self._m[name]
        assert isinstance(metric, Gauge)
        return metric.labels(**self._labels)

    def _counter(self, name: str, **extra: str) -> Counter:
        metric = self._m[name]
        assert isinstance(metric, Counter)
        return metric.labels(**self._labels, **extra)

    def job_info(self, *, world_size: int, restart_count: int) -> None:
        """Set the gauges that describe the job (once per process)."""
        self._gauge("stormwatch_train_world_size").set(world_size)
        self._gauge("stormwatch_train_restart_count").set(restart_count)

    def started(self, *, step: int, timestamp: float) -> None:
        """The rank is ready to train from ``step`` (0 or the resumed step).

        Sets the step and the heartbeat so that a rank that hangs before its
        first step goes stale instead of having no series at all.
        """
        self._gauge("stormwatch_train_step").set(step)
        self._gauge("stormwatch_train_last_step_timestamp_seconds").set(timestamp)

    def step(
        self, *, step: int, loss: float, seconds: float, tokens: int, timestamp: float
    ) -> None:
        """Record one completed step (``seconds`` > 0 wall time, ``tokens`` processed)."""
        self._gauge("stormwatch_train_step").set(step)
        self._gauge("stormwatch_train_loss").set(loss)
        self._gauge("stormwatch_train_last_step_timestamp_seconds").set(timestamp)
        if seconds > 0:
            self._gauge("stormwatch_train_tokens_per_second").set(tokens / seconds)
        histogram = self._m["stormwatch_train_step_duration_seconds"]
        assert isinstance(histogram, Histogram)
        histogram.labels(**self._labels).observe(seconds)
        self._counter("stormwatch_train_steps").inc()
        self._counter("stormwatch_train_tokens").inc(tokens)

    def collective_issued(self, op: str, nbytes: int) -> None:
        """Count one collective ``op`` with ``nbytes`` input bytes."""
        self._counter("stormwatch_collective_calls", op=op).inc()
        self._counter("stormwatch_collective_bytes", op=op).inc(nbytes)

    def collective_completed(self, op: str, seconds: float) -> None:
        """Add the issue-to-completion time of one collective ``op``."""
        self._counter("stormwatch_collective_duration_seconds", op=op).inc(max(seconds, 0.0))

    def telemetry_error(self, sink: str) -> None:
        """Count one failed telemetry write."""
        self._counter("stormwatch_train_telemetry_errors", sink=sink).inc()


__all__ = ["CATALOGUE", "STEP_DURATION_BUCKETS", "MetricSpec", "RankMetrics", "enable_multiprocess"]
