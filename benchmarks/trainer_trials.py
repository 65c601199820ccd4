"""The trials of ``benchmarks/trainer_bench.py``: the plan, each variant's config, and a rank's run.

Every torchrun rank (``trainer_bench.py --worker DIR``) reads ``plan.json``, runs
every trial of the plan in order with :func:`stormwatch.trainer.loop.train` and
writes its figures to ``<DIR>/rank<R>.json``; the variants are described in
``trainer_bench.py``'s docstring. torch is imported on first use only, so the
parent process stays light.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from thread_cpu import Snapshot, cpu_by_thread, difference

VARIANTS = ("bare", "counting", "instrumented", "disarmed", "bare-again", "ckpt-sync", "ckpt-async")
STEP_VARIANTS = VARIANTS[:5]
#: RankEnv.attempt of trial i is ATTEMPT_BASE + i: the trainer prefixes the
#: torchrun store with the attempt, so each trial's process group gets fresh keys.
ATTEMPT_BASE = 1000


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every worker runs (written to ``plan.json`` by the parent)."""

    reps: int = 5
    steps: int = 30
    warmup: int = 5
    ckpt_steps: int = 16
    ckpt_every: int = 4
    ckpt_d_model: int = 256
    ckpt_layers: int = 4
    warmup_trials: bool = True
    #: the mesh (``--mesh DPxTP``): FSDP2 over ``dp`` ranks x TP over ``tp``; world size dp*tp
    dp: int = 2
    tp: int = 2
    #: the CPUs the torchrun job may run on (``--cpus``); empty: all of the machine's
    cpus: tuple[int, ...] = ()
    #: the variants run (``--variants``), in VARIANTS' order
    variants: tuple[str, ...] = VARIANTS

    @property
    def nproc(self) -> int:
        """Ranks of the torchrun job (one node): ``dp * tp``."""
        return self.dp * self.tp

    def trials(self) -> list[tuple[int, str]]:
        """(repetition, variant) in run order; repetition -1 is a warm-up trial."""
        variants = tuple(self.variants)
        warmups = [(-1, v) for v in ("instrumented", "ckpt-async") if v in variants]
        out = warmups if self.warmup_trials else []
        for rep in range(self.reps):
            shift = rep % len(variants)
            out += [(rep, v) for v in variants[shift:] + variants[:shift]]
        return out


#: ``--quick``: every code path once, as fast as possible (the end-to-end test).
QUICK = Plan(
    reps=1, steps=6, warmup=2, ckpt_steps=6, ckpt_every=2, ckpt_d_model=64, ckpt_layers=2,
    warmup_trials=False,
)  # fmt: skip


# --------------------------------------------------------------------------- worker side
def _config(plan: Plan, variant: str, trial_dir: Path, shared: Path) -> Any:
    from stormwatch.trainer.config import (
        CheckpointConfig,
        ControlConfig,
        DebugConfig,
        ModelConfig,
        TelemetryConfig,
        TracingConfig,
        TrainConfig,
    )

    bare = TelemetryConfig(job="bench", count_collectives=False)
    common: dict[str, Any] = {"dp": plan.dp, "tp": plan.tp, "debug": DebugConfig()}
    if variant in ("bare", "bare-again"):
        return TrainConfig(steps=plan.steps, telemetry=bare, **common)
    if variant == "counting":
        counting = TelemetryConfig(job="bench", count_collectives=True)
        return TrainConfig(steps=plan.steps, telemetry=counting, **common)
    if variant == "disarmed":
        return TrainConfig(
            steps=plan.steps,
            telemetry=bare,
            control=ControlConfig(directory=trial_dir / "control"),
            **common,
        )
    if variant == "instrumented":
        return TrainConfig(
            steps=plan.steps,
            telemetry=TelemetryConfig(
                job="bench", log_dir=shared / "logs", metrics_dir=shared / "metrics"
            ),
            tracing=TracingConfig(spans_dir=shared / "spans"),
            control=ControlConfig(directory=shared / "control"),
            **common,
        )
    mode = variant.removeprefix("ckpt-")
    return TrainConfig(
        steps=plan.ckpt_steps,
        model=ModelConfig(d_model=plan.ckpt_d_model, n_layers=plan.ckpt_layers),
        checkpoint=CheckpointConfig(
            directory=trial_dir / "ckpt", every=plan.ckpt_every, keep=2, mode=mode
        ),
        telemetry=bare,
        tracing=TracingConfig(spans_dir=trial_dir / "spans"),
        **common,
    )


def _counters(metrics_dir: Path, rank: int) -> tuple[float, float, float]:
    """This rank's (compute seconds, collective wait seconds, collectives) counters."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    found = {"compute": 0.0, "wait": 0.0, "calls": 0.0}
    names = {
        "stormwatch_train_compute_seconds_total": "compute",
        "stormwatch_train_collective_wait_seconds_total": "wait",
        "stormwatch_collective_calls_total": "calls",
    }
    for family in registry.collect():
        for sample in family.samples:
            key = names.get(sample.name)
            if key is not None and sample.labels.get("rank") == str(rank):
                found[key] += sample.value
    return found["compute"], found["wait"], found["calls"]


def _span_seconds(spans_file: Path, last_step: int, first_step: int) -> dict[str, list[float]]:
    """checkpoint_save / _copy / _commit durations (s) of checkpoints first_step < s < last_step
    (``checkpoint_copy``: the loop waiting for an async save's copy before its optimizer step)."""
    out: dict[str, list[float]] = {
        "checkpoint_save": [],
        "checkpoint_copy": [],
        "checkpoint_commit": [],
    }
    for line in spans_file.read_text().splitlines():
        span = json.loads(line)
        if span["name"] not in out:
            continue
        step = span.get("attributes", {}).get("step")
        if step is None or not first_step < step < last_step:
            continue
        start = datetime.datetime.fromisoformat(span["start_time"])
        end = datetime.datetime.fromisoformat(span["end_time"])
        out[span["name"]].append((end - start).total_seconds())
    return out


def _checkpoint_bytes(root: Path) -> int:
    """Size of the largest complete checkpoint folder under ``root``."""
    sizes = [
        sum(f.stat().st_size for f in d.iterdir() if f.is_file())
        for d in root.glob("step-*")
        if (d / ".metadata").exists()
    ]
    return max(sizes, default=0)


def write_expired_faults(path: Path) -> None:
    """A control file whose fault points all expired an hour ago (nothing armed)."""
    from stormwatch.faults.control_file import ENTRY, write_entries

    past = time.time() - 3600
    faults = [
        {"point": "slow_step", "seconds": 0.5, "expires_at": past},
        {"point": "collective_delay", "seconds": 0.2, "op": "all_reduce", "expires_at": past},
        {"point": "collective_hang", "op": "all_gather", "expires_at": past},
    ]
    write_entries(path, [ENTRY.validate_python(f) for f in faults])


class _GcTimer:
    """The garbage collector's collections on the training thread between :meth:`start` and
    :meth:`stop`: their count by generation and their thread CPU seconds (``gc.callbacks``)."""

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self._began = 0.0
        self.seconds = 0.0
        self.counts = [0, 0, 0]
        self._on = False

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if not self._on or threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._began = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._began
            self.counts[info["generation"]] += 1

    def start(self) -> None:
        self._on = True
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        self._on = False
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def result(self) -> dict[str, float]:
        return {"seconds": self.seconds, **{f"gen{g}": n for g, n in enumerate(self.counts)}}


def worker(work: Path) -> int:
    """One torchrun rank: every trial of the plan, results to ``<work>/rank<R>.json``."""
    from stormwatch.faults.control_file import control_path
    from stormwatch.telemetry.collective_ops import KERNELS
    from stormwatch.telemetry.dump import (
        DEFAULT_FLIGHT_RECORDER_ENTRIES,
        flight_recorder_environ,
    )
    from stormwatch.trainer.progress import ConsoleProgress
    from stormwatch.trainer.runtime import RankEnv

    env = RankEnv.from_environ(os.environ)
    plan = Plan(**json.loads((work / "plan.json").read_text()))
    # As `stormwatch train` does, before any process group exists (all variants).
    os.environ.update(flight_recorder_environ(None, DEFAULT_FLIGHT_RECORDER_ENTRIES))
    from stormwatch.trainer.loop import train

    shared = work / "shared"

    class Recorder(ConsoleProgress):
        """Times whole loop iterations (wall and process CPU); snapshots the counters once warm.

        An iteration runs from one ``progress.step`` call to the next: the step
        plus everything the loop does around it (telemetry, spans, polling).
        """

        def __init__(self, warmup: int, last: int, metrics_dir: Path | None) -> None:
            super().__init__(quiet=True)
            self.warmup, self.last, self.metrics_dir = warmup, last, metrics_dir
            # CPU seconds by thread from the first timed iteration's start to the last's end
            self.threads_at_warm: Snapshot = {}
            self.threads: dict[str, float] = {}
            self.wall: list[float] = []
            self.cpu: list[float] = []
            self.thread: list[float] = []  # the training thread's CPU alone
            self.at_warm: tuple[float, float, float] | None = None
            self._last = (0.0, 0.0, 0.0)
            self.gc = _GcTimer()

        def step(self, *, step: int, **rest: Any) -> None:
            now = (time.perf_counter(), time.process_time(), time.thread_time())
            if step > self.warmup + 1:
                self.wall.append(now[0] - self._last[0])
                self.cpu.append(now[1] - self._last[1])
                self.thread.append(now[2] - self._last[2])
            if step == self.warmup + 1 and self.metrics_dir is not None:
                # called before step_details(step): the counters hold steps 1..warmup;
                # the metrics are flushed every 0.1 s: wait for the flusher to catch up
                time.sleep(0.3)
                self.at_warm = _counters(self.metrics_dir, env.rank)
            if step == self.warmup + 1:
                self.threads_at_warm = cpu_by_thread("training thread")
                self.gc.start()
            elif step == self.last:
                self.threads = difference(self.threads_at_warm, cpu_by_thread("training thread"))
                self.gc.stop()
            self._last = (time.perf_counter(), time.process_time(), time.thread_time())

    results: list[dict[str, Any]] = []
    trials = plan.trials()
    for index, (rep, variant) in enumerate(trials):
        trial_dir = work / "trials" / f"{index:03d}-{variant}"
        config = _config(plan, variant, trial_dir, shared)
        if variant == "disarmed":
            write_expired_faults(control_path(trial_dir / "control", env.rank))
        metrics_dir = config.telemetry.metrics_dir
        recorder = Recorder(plan.warmup, config.steps, metrics_dir)
        started = time.monotonic()
        train(config, dataclasses.replace(env, attempt=ATTEMPT_BASE + index), progress=recorder)
        KERNELS.uninstall()  # the next trial may be bare: no kernel on the c10d ops
        result = _trial_result(
            plan,
            rep,
            variant,
            rank=env.rank,
            wall=recorder.wall,
            cpu=recorder.cpu,
            thread=recorder.thread,
            threads=recorder.threads,
            gc=recorder.gc.result(),
            at_warm=recorder.at_warm,
            metrics_dir=metrics_dir,
            trial_dir=trial_dir,
        )
        results.append(result)
        if env.rank == 0:
            median_ms = statistics.median(recorder.wall) * 1000 if recorder.wall else 0.0
            label = "warm-up" if rep < 0 else f"rep {rep + 1}/{plan.reps}"
            print(
                f">> [{index + 1}/{len(trials)}] {label} {variant:<12} "
                f"{median_ms:7.1f} ms/step ({time.monotonic() - started:.1f} s)",
                flush=True,
            )
    (work / f"rank{env.rank}.json").write_text(json.dumps(results))
    return 0


def _trial_result(
    plan: Plan,
    rep: int,
    variant: str,
    *,
    rank: int,
    wall: list[float],
    cpu: list[float],
    thread: list[float],
    threads: dict[str, float],
    gc: dict[str, float],
    at_warm: tuple[float, float, float] | None,
    metrics_dir: Path | None,
    trial_dir: Path,
) -> dict[str, Any]:
    """One trial's figures on this rank: step times, counters after warm-up, checkpoint spans."""
    result: dict[str, Any] = {
        "rep": rep,
        "variant": variant,
        "wall": wall,
        "cpu": cpu,
        "thread": thread,
        "threads": threads,
        "gc": gc,
        "cpus": sorted(os.sched_getaffinity(0)),  # where this rank could run (``--cpus``)
    }
    if metrics_dir is not None and at_warm is not None:
        compute, wait, calls = _counters(metrics_dir, rank)
        result["compute_seconds"] = compute - at_warm[0]
        result["wait_seconds"] = wait - at_warm[1]
        # counted while each step runs, before progress.step: the steps timed in ``wall``
        result["collectives_per_step"] = (calls - at_warm[2]) / max(len(wall), 1)
    if variant.startswith("ckpt-"):
        spans = trial_dir / "spans" / f"rank{rank}.jsonl"
        result["spans"] = _span_seconds(spans, plan.ckpt_steps, plan.ckpt_every)
        result["checkpoints"] = (plan.ckpt_steps // plan.ckpt_every) - 2
        if rank == 0:
            result["checkpoint_bytes"] = _checkpoint_bytes(trial_dir / "ckpt")
    return result


__all__ = [
    "ATTEMPT_BASE",
    "QUICK",
    "STEP_VARIANTS",
    "VARIANTS",
    "Plan",
    "worker",
]
