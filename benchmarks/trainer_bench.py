#!/usr/bin/env python3
"""Benchmark the reference trainer against itself, side by side in one run.

One ``torchrun`` job of 4 CPU ranks (gloo, FSDP2 dp=2 x TP tp=2) runs
``stormwatch.trainer.loop.train`` many times in the same worker processes,
one short training run ("trial") per variant, the variants interleaved in
every repetition (their order rotating) so that all of them see the same
machine load. Variants:

* ``bare``: the same model and mesh with telemetry (metrics, event log),
  collective counting (``TelemetryConfig.count_collectives=False``),
  tracing and the control channel switched off;
* ``counting``: ``bare`` plus collective counting alone (the kernels on the
  ``c10d`` ops, ``trainer/telemetry/collective_ops.py``, and the counter of
  ``trainer/telemetry/comms.py``; its sinks write nowhere);
* ``instrumented``: as ``stormwatch train`` runs in the lab: prometheus
  multiprocess metrics, JSON-lines event log, span files, collective counting
  and the control channel (folder present, no file);
* ``disarmed``: ``bare`` plus the control channel polled every step, its file
  holding only expired fault points (the state the chaos controller leaves);
* ``bare-again``: ``bare`` once more: the A/A comparison that shows how far
  two identical variants differ on this machine (the noise floor);
* ``ckpt-sync`` / ``ckpt-async``: a larger model (same mesh) checkpointing
  every ``ckpt_every`` steps with ``--checkpoint-mode sync`` / ``async``.

Measured (medians; ratios are the median over repetitions of each
repetition's ratio, with their min..max):

* instrumentation overhead: instrumented / bare step time (target <= 1.02),
  in wall time and in process CPU time (all threads: gloo, span export);
  CPU time is the robust figure on a shared machine, where wall time swings
  with the neighbours' load;
* collective counting, timed directly (the per-step ratios of a few per
  cent drown in this machine's noise): one process, world size 1, gloo,
  ``dist.all_reduce`` of 64 bytes with and without a counter entered,
  interleaved; the difference per collective times the collectives per step
  (rank 0's ``stormwatch_collective_calls_total`` in the instrumented trials)
  over the bare step's CPU time. The kernels are removed after every trial,
  so ``bare`` trials are bare;
* disarmed fault points: disarmed / bare step time (claim: nothing
  measurable: its distance from 1 at most the largest distance from 1 of the
  A/A ratios), plus the channel's own per-step work timed directly;
* checkpoint blocking: time the training loop spends in its
  ``checkpoint_save`` + ``checkpoint_commit`` spans per checkpoint, async /
  sync (target <= 0.1), same state; the first and the last checkpoint of each
  trial are left out (one-time set-up; the final commit waits for the write
  on purpose);
* exposed communication: collective wait / step time, from the trainer's own
  ``stormwatch_train_collective_wait_seconds`` and ``..._compute_seconds``
  counters (instrumented trials, per rank; the wait includes the
  gradient-norm all-reduce, see ``trainer/loop.py``).

A "step" is one loop iteration (from one ``progress.step`` call to the next,
rank 0: the step plus the telemetry, spans and polling around it), after
``warmup`` steps of each trial. The flight recorder is on in every variant
(a process-wide setting, as ``stormwatch train`` sets it). No assertion is
made on any figure: the table is for people; README.md "Benchmarks" records runs.

Usage::

    .venv/bin/python benchmarks/trainer_bench.py [--quick] [--reps 5] [--json results.json]

Takes about 6 minutes on 2 shared cores (``--quick``: one repetition of short trials,
well under a minute, for the end-to-end test). Everything runs in a
temporary directory that is removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NPROC = 4
DP, TP = 2, 2
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

    def trials(self) -> list[tuple[int, str]]:
        """(repetition, variant) in run order; repetition -1 is a warm-up trial."""
        out = [(-1, "instrumented"), (-1, "ckpt-async")] if self.warmup_trials else []
        for rep in range(self.reps):
            shift = rep % len(VARIANTS)
            out += [(rep, v) for v in VARIANTS[shift:] + VARIANTS[:shift]]
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
    common: dict[str, Any] = {"dp": DP, "tp": TP, "debug": DebugConfig()}
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
    """checkpoint_save / checkpoint_commit durations (s) of checkpoints first_step < s < last_step."""
    out: dict[str, list[float]] = {"checkpoint_save": [], "checkpoint_commit": []}
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


def _write_expired_faults(path: Path) -> None:
    """A control file whose fault points all expired an hour ago (nothing armed)."""
    from stormwatch.faults.control_file import ENTRY, write_entries

    past = time.time() - 3600
    faults = [
        {"point": "slow_step", "seconds": 0.5, "expires_at": past},
        {"point": "collective_delay", "seconds": 0.2, "op": "all_reduce", "expires_at": past},
        {"point": "collective_hang", "op": "all_gather", "expires_at": past},
    ]
    write_entries(path, [ENTRY.validate_python(f) for f in faults])


def worker(work: Path) -> int:
    """One torchrun rank: every trial of the plan, results to ``<work>/rank<R>.json``."""
    from stormwatch.faults.control_file import control_path
    from stormwatch.trainer.progress import ConsoleProgress
    from stormwatch.trainer.runtime import RankEnv
    from stormwatch.trainer.telemetry.collective_ops import KERNELS
    from stormwatch.trainer.telemetry.dump import (
        DEFAULT_FLIGHT_RECORDER_ENTRIES,
        flight_recorder_environ,
    )

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

        def __init__(self, warmup: int, metrics_dir: Path | None) -> None:
            super().__init__(quiet=True)
            self.warmup, self.metrics_dir = warmup, metrics_dir
            self.wall: list[float] = []
            self.cpu: list[float] = []
            self.at_warm: tuple[float, float, float] | None = None
            self._last = (0.0, 0.0)

        def step(self, *, step: int, **rest: Any) -> None:
            now = (time.perf_counter(), time.process_time())
            if step > self.warmup + 1:
                self.wall.append(now[0] - self._last[0])
                self.cpu.append(now[1] - self._last[1])
            if step == self.warmup + 1 and self.metrics_dir is not None:
                # called before step_details(step): the counters hold steps 1..warmup
                self.at_warm = _counters(self.metrics_dir, env.rank)
            self._last = (time.perf_counter(), time.process_time())

    results: list[dict[str, Any]] = []
    trials = plan.trials()
    for index, (rep, variant) in enumerate(trials):
        trial_dir = work / "trials" / f"{index:03d}-{variant}"
        config = _config(plan, variant, trial_dir, shared)
        if variant == "disarmed":
            _write_expired_faults(control_path(trial_dir / "control", env.rank))
        metrics_dir = config.telemetry.metrics_dir
        recorder = Recorder(plan.warmup, metrics_dir)
        started = time.monotonic()
        train(config, dataclasses.replace(env, attempt=ATTEMPT_BASE + index), progress=recorder)
        KERNELS.uninstall()  # the next trial may be bare: no kernel on the c10d ops
        result: dict[str, Any] = {
            "rep": rep,
            "variant": variant,
            "wall": recorder.wall,
            "cpu": recorder.cpu,
        }
        if metrics_dir is not None and recorder.at_warm is not None:
            compute, wait, calls = _counters(metrics_dir, env.rank)
            result["compute_seconds"] = compute - recorder.at_warm[0]
            result["wait_seconds"] = wait - recorder.at_warm[1]
            # counted while each step runs, before progress.step: the steps timed in ``wall``
            result["collectives_per_step"] = (calls - recorder.at_warm[2]) / max(
                len(recorder.wall), 1
            )
        if variant.startswith("ckpt-"):
            spans = trial_dir / "spans" / f"rank{env.rank}.jsonl"
            result["spans"] = _span_seconds(spans, plan.ckpt_steps, plan.ckpt_every)
            result["checkpoints"] = (plan.ckpt_steps // plan.ckpt_every) - 2
            if env.rank == 0:
                result["checkpoint_bytes"] = _checkpoint_bytes(trial_dir / "ckpt")
        results.append(result)
        if env.rank == 0:
            median = statistics.median(recorder.wall) * 1000 if recorder.wall else 0.0
            label = "warm-up" if rep < 0 else f"rep {rep + 1}/{plan.reps}"
            print(
                f">> [{index + 1}/{len(trials)}] {label} {variant:<12} "
                f"{median:7.1f} ms/step ({time.monotonic() - started:.1f} s)",
                flush=True,
            )
    (work / f"rank{env.rank}.json").write_text(json.dumps(results))
    return 0


# --------------------------------------------------------------------------- parent side
def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _channel_cost(step_seconds: float) -> dict[str, float]:
    """The control channel's per-step work, timed directly (no torch): seconds per step."""
    from stormwatch.faults.control_file import control_path
    from stormwatch.trainer.control import ControlChannel

    with tempfile.TemporaryDirectory(prefix="stormwatch-bench-control-") as tmp:
        path = control_path(Path(tmp), 0)
        _write_expired_faults(path)
        channel = ControlChannel(path)
        channel.poll()
        rounds = 20000
        started = time.perf_counter()
        for step in range(rounds):
            channel.poll()
            channel.check_step(step + 1)
            channel.slow_step()
            channel.checkpoint_wanted(None)
        per_step = (time.perf_counter() - started) / rounds
    return {"seconds": per_step, "share": per_step / step_seconds if step_seconds else 0.0}


def _counter_cost(step_cpu_seconds: float, per_step: float) -> dict[str, float]:
    """The collective counter's work, timed directly (see the module docstring)."""
    import torch
    import torch.distributed as dist

    from stormwatch.trainer.telemetry.collective_ops import KERNELS
    from stormwatch.trainer.telemetry.comms import CollectiveCounter

    class NullSink:
        def on_issue(self, op: str, nbytes: int) -> None: ...
        def on_complete(self, op: str, seconds: float) -> None: ...
        def on_error(self, where: str, exc: BaseException) -> None:
            raise RuntimeError(f"{where}: {exc}") from exc

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        tensor, calls = torch.ones(16), 200
        counter = CollectiveCounter(NullSink())

        def per_call() -> float:
            started = time.process_time()
            for _ in range(calls):
                dist.all_reduce(tensor)
            return (time.process_time() - started) / calls

        bare: list[float] = []
        counting: list[float] = []
        for _ in range(30):
            KERNELS.uninstall()
            bare.append(per_call())
            with counter:
                counting.append(per_call())
            counter.take_wait_seconds()
        KERNELS.uninstall()
    finally:
        dist.destroy_process_group()
    extra = max(_median(counting) - _median(bare), 0.0)
    return {
        "bare_call_seconds": _median(bare),
        "seconds_per_collective": extra,
        "collectives_per_step": per_step,
        "share": extra * per_step / step_cpu_seconds if step_cpu_seconds else 0.0,
    }


def aggregate(plan: Plan, ranks: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per-rank trial results -> the figures of the table (see the module docstring)."""

    def trial(rep: int, variant: str, rank: int = 0) -> dict[str, Any]:
        return next(r for r in ranks[rank] if r["rep"] == rep and r["variant"] == variant)

    def pooled(variant: str, key: str) -> float:
        """Median over every measured iteration of rank 0 (all repetitions)."""
        return _median(
            [x for r in ranks[0] if r["variant"] == variant and r["rep"] >= 0 for x in r[key]]
        )

    def paired(variant: str, key: str) -> list[float]:
        """Per repetition: median(variant) / median(bare), rank 0."""
        return [
            _median(trial(rep, variant)[key]) / _median(trial(rep, "bare")[key])
            for rep in range(plan.reps)
        ]

    def blocking(rep: int, variant: str, span: str) -> float:
        """Seconds per checkpoint spent in ``span``, averaged over ranks."""
        per_rank = []
        for rank in range(len(ranks)):
            result = trial(rep, variant, rank)
            per_rank.append(sum(result["spans"][span]) / max(result["checkpoints"], 1))
        return statistics.fmean(per_rank)

    def exposed(rep: int, rank: int) -> float:
        result = trial(rep, "instrumented", rank)
        busy = result["compute_seconds"] + result["wait_seconds"]
        return float(result["wait_seconds"] / busy) if busy > 0 else float("nan")

    ckpt: dict[str, list[float]] = {}
    for variant in ("ckpt-sync", "ckpt-async"):
        for span in ("checkpoint_save", "checkpoint_commit"):
            ckpt[f"{variant}/{span}"] = [blocking(rep, variant, span) for rep in range(plan.reps)]
    sync = [
        a + b
        for a, b in zip(
            ckpt["ckpt-sync/checkpoint_save"], ckpt["ckpt-sync/checkpoint_commit"], strict=True
        )
    ]
    async_ = [
        a + b
        for a, b in zip(
            ckpt["ckpt-async/checkpoint_save"], ckpt["ckpt-async/checkpoint_commit"], strict=True
        )
    ]
    fractions = [
        _median([exposed(rep, rank) for rep in range(plan.reps)]) for rank in range(len(ranks))
    ]
    bare_wall = pooled("bare", "wall")
    per_step = _median([r["collectives_per_step"] for r in ranks[0] if "collectives_per_step" in r])
    return {
        "wall_seconds": {v: pooled(v, "wall") for v in VARIANTS},
        "cpu_seconds": {v: pooled(v, "cpu") for v in STEP_VARIANTS},
        "wall_ratio": {v: paired(v, "wall") for v in STEP_VARIANTS[1:]},
        "cpu_ratio": {v: paired(v, "cpu") for v in STEP_VARIANTS[1:]},
        "channel_cost": _channel_cost(bare_wall),
        "counter_cost": _counter_cost(pooled("bare", "cpu"), per_step),
        "ckpt_parts_seconds": {k: _median(v) for k, v in ckpt.items()},
        "ckpt_sync_seconds": sync,
        "ckpt_async_seconds": async_,
        "ckpt_ratio": [a / s for a, s in zip(async_, sync, strict=True)],
        "checkpoint_bytes": max(r.get("checkpoint_bytes", 0) for r in ranks[0]),
        "exposed_fraction_by_rank": fractions,
    }


def machine() -> dict[str, str]:
    """Cores, CPU model, torch and Python versions, date, load (no torch import)."""
    from importlib.metadata import version

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{os.cpu_count()} cores, {cpu}",
        "torch": version("torch"),
        "python": platform.python_version(),
        "loadavg": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def report(plan: Plan, figures: dict[str, Any], host: dict[str, str]) -> None:
    """Print the table (rich) and the notes under it."""
    from rich.console import Console
    from rich.table import Table

    def spread(values: list[float], fmt: str = "{:.3f}") -> str:
        return f"{fmt.format(min(values))}..{fmt.format(max(values))}"

    def verdict(value: float, limit: float) -> str:
        return f"<= {limit}" + (" OK" if value <= limit else " MISSED")

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.1f} ms"

    wall, cpu = figures["wall_seconds"], figures["cpu_seconds"]
    table = Table(
        title=f"trainer: {NPROC} CPU ranks (gloo), dp={DP} x tp={TP}, "
        f"{plan.reps} interleaved repetition(s); step = one loop iteration, rank 0"
    )
    for column in ("measure", "baseline", "measured", "ratio (median)", "min..max", "target"):
        table.add_column(column, justify="left" if column == "measure" else "right")

    def step_row(label: str, variant: str, kind: str, target: str) -> None:
        values = figures[f"{kind}_ratio"][variant]
        source = wall if kind == "wall" else cpu
        ratio = _median(values)
        if target == "A/A":
            noise = max(abs(r - 1) for r in figures[f"{kind}_ratio"]["bare-again"])
            target = f"|r-1| <= {noise:.3f} (A/A) " + (
                "OK" if abs(ratio - 1) <= noise else "MISSED"
            )
        table.add_row(
            label,
            ms(source["bare"]),
            ms(source[variant]),
            f"{ratio:.3f}",
            spread(values),
            verdict(ratio, 1.02) if target == "1.02" else target,
        )

    step_row(
        "instrumentation overhead: step wall time, instrumented / bare",
        "instrumented",
        "wall",
        "1.02",
    )
    step_row("  same, process CPU time per step", "instrumented", "cpu", "(robust)")
    step_row("  of which collective counting alone (wall)", "counting", "wall", "")
    step_row("  of which collective counting alone (CPU)", "counting", "cpu", "")
    step_row(
        "disarmed fault points: channel on, nothing armed / off (wall)", "disarmed", "wall", "A/A"
    )
    step_row("  same, process CPU time per step", "disarmed", "cpu", "A/A")
    step_row("noise floor (A/A): bare again / bare (wall)", "bare-again", "wall", "")
    step_row("  same, process CPU time per step", "bare-again", "cpu", "")
    ratio = _median(figures["ckpt_ratio"])
    table.add_row(
        f"checkpoint: loop blocked per save, async / sync "
        f"({figures['checkpoint_bytes'] / 2**20:.1f} MiB each)",
        ms(_median(figures["ckpt_sync_seconds"])),
        ms(_median(figures["ckpt_async_seconds"])),
        f"{ratio:.3f}",
        spread(figures["ckpt_ratio"]),
        verdict(ratio, 0.1),
    )
    by_rank = figures["exposed_fraction_by_rank"]
    table.add_row(
        "exposed communication: collective wait / step time (instrumented)",
        "-",
        f"{statistics.fmean(by_rank) * 100:.1f} %",
        "-",
        spread([f * 100 for f in by_rank], "{:.1f}") + " % by rank",
        "(reported)",
    )
    Console(width=170).print(table)
    cost = figures["channel_cost"]
    counting = figures["counter_cost"]
    print(
        f"collective counting, timed directly: {counting['seconds_per_collective'] * 1e6:.1f} us "
        f"per collective (a bare all_reduce: {counting['bare_call_seconds'] * 1e6:.1f} us) x "
        f"{counting['collectives_per_step']:.1f} collectives per step = "
        f"{counting['share'] * 100:.2f} % of a bare step's CPU time"
    )
    parts = figures["ckpt_parts_seconds"]
    print(
        f"control channel work per step (poll + checks; file of expired faults), timed directly: "
        f"{cost['seconds'] * 1e6:.1f} us = {cost['share'] * 100:.3f} % of a bare step"
    )
    print(
        f"checkpoint blocking by span (median ms per save): sync save "
        f"{parts['ckpt-sync/checkpoint_save'] * 1000:.1f}; async save (staging, agreeing) "
        f"{parts['ckpt-async/checkpoint_save'] * 1000:.1f} + commit (marker, checksums, rename) "
        f"{parts['ckpt-async/checkpoint_commit'] * 1000:.1f}. Step wall time while "
        f"checkpointing every {plan.ckpt_every}: sync {ms(wall['ckpt-sync'])}, "
        f"async {ms(wall['ckpt-async'])} (writes overlap training)"
    )
    print(
        f"machine: {host['cpu']}; torch {host['torch']}, Python {host['python']}; "
        f"{host['date']}; load average after the run: {host['loadavg']}"
    )


def run_torchrun(work: Path, plan: Plan, timeout: float) -> list[list[dict[str, Any]]]:
    (work / "plan.json").write_text(json.dumps(dataclasses.asdict(plan)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(NPROC), str(Path(__file__).resolve()), "--worker", str(work),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, timeout=timeout, check=False, cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"the benchmark's torchrun job failed (exit {done.returncode})")
    return [json.loads((work / f"rank{r}.json").read_text()) for r in range(NPROC)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short repetition (smoke test)")
    parser.add_argument("--reps", type=int, help=f"repetitions (default {Plan.reps})")
    parser.add_argument("--steps", type=int, help=f"steps per trial (default {Plan.steps})")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker(args.worker)
    plan = QUICK if args.quick else Plan()
    if args.reps is not None:
        plan = dataclasses.replace(plan, reps=args.reps)
    if args.steps is not None:
        plan = dataclasses.replace(plan, steps=args.steps)
    if plan.reps < 1 or plan.steps <= plan.warmup:
        parser.error(f"--reps must be >= 1 and --steps > {plan.warmup} (the warm-up steps)")
    trials = len(plan.trials())
    print(
        f">> {NPROC} ranks, {trials} trials ({plan.reps} x {len(VARIANTS)} variants, "
        f"{trials - plan.reps * len(VARIANTS)} warm-up), "
        f"{plan.steps} steps each ({plan.ckpt_steps} for checkpoints)",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="stormwatch-trainer-bench-"))
    try:
        ranks = run_torchrun(work, plan, timeout=120 + trials * 60)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = aggregate(plan, ranks)
    host = machine()
    report(plan, figures, host)
    if args.json:
        args.json.write_text(
            json.dumps({"plan": dataclasses.asdict(plan), "machine": host, **figures}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
