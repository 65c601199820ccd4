#!/usr/bin/env python3
"""Benchmark the reference trainer against itself, side by side in one run.

One ``torchrun`` job of 4 CPU ranks (gloo, FSDP2 dp=2 x TP tp=2; ``--mesh`` sets another) runs
``stormwatch.trainer.loop.train`` many times in the same worker processes,
one short training run ("trial") per variant, the variants interleaved in
every repetition (their order rotating) so that all of them see the same
machine load. Variants:

* ``bare``: the same model and mesh with telemetry (metrics, event log),
  collective counting (``TelemetryConfig.count_collectives=False``),
  tracing and the control channel switched off;
* ``counting``: ``bare`` plus collective counting alone (the kernels on the
  ``c10d`` ops, ``telemetry/collective_ops.py``, and the counter of
  ``telemetry/comms.py``; its sinks write nowhere);
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
  in wall time, in the training thread's CPU time (``time.thread_time`` of rank 0's
  main thread: what the telemetry costs the thread that trains; its flusher, span
  exporter and gloo's threads are others) and in process CPU time (all threads);
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
  ``checkpoint_save`` + ``checkpoint_copy`` (async: waiting for the save's copy
  of the state before the next optimizer step, when it has not ended) +
  ``checkpoint_commit`` spans per checkpoint, async / sync (target <= 0.1),
  same state; the first and the last checkpoint of each trial are left out
  (one-time set-up; the final commit waits for the write on purpose);
* where the remaining cost lies: ``hotpath_profile.py`` in a child process (one
  process, gloo at world size 1, a stand-in step with the collectives per step of rank
  0): the training thread's CPU per step with and without the telemetry, and a cProfile
  of the instrumented steps summarised by part (collective counting, spans, step mark,
  prometheus-client, ...);
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
        [--variants ckpt-sync,ckpt-async]   # the checkpoint trials alone
        [--mesh 1x2]   # 2 ranks: one a core on a 2-core machine (default 2x2, 4 ranks)
        [--cpus 0]     # the job on CPU 0 alone: its ranks share one core

The plan and what each rank runs: ``trainer_trials.py``; the printed table and
notes: ``trainer_report.py`` (siblings of this script).

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

from hotpath_profile import in_child as hot_path_profile
from trainer_report import median, report
from trainer_trials import (
    QUICK,
    STEP_VARIANTS,
    VARIANTS,
    Plan,
    worker,
    write_expired_faults,
)


# --------------------------------------------------------------------------- parent side
def _channel_cost(step_seconds: float) -> dict[str, float]:
    """The control channel's per-step work, timed directly (no torch): seconds per step."""
    from stormwatch.faults.control_file import control_path
    from stormwatch.trainer.control import ControlChannel

    with tempfile.TemporaryDirectory(prefix="stormwatch-bench-control-") as tmp:
        path = control_path(Path(tmp), 0)
        write_expired_faults(path)
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

    from stormwatch.telemetry.collective_ops import KERNELS
    from stormwatch.telemetry.comms import CollectiveCounter

    class NullSink:
        def on_issue(self, op: str, nbytes: int) -> None: ...
        def on_complete(self, op: str, seconds: float, ago: float = 0.0) -> None: ...
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
    extra = max(median(counting) - median(bare), 0.0)
    return {
        "bare_call_seconds": median(bare),
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
        return median(
            [x for r in ranks[0] if r["variant"] == variant and r["rep"] >= 0 for x in r[key]]
        )

    def paired(variant: str, key: str) -> list[float]:
        """Per repetition: median(variant) / median(bare), rank 0."""
        return [
            median(trial(rep, variant)[key]) / median(trial(rep, "bare")[key])
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

    if not set(STEP_VARIANTS) <= set(plan.variants):  # --variants ckpt-sync,ckpt-async
        return _ckpt_figures(plan, blocking, [r for r in ranks[0] if r["rep"] >= 0])
    fractions = [
        median([exposed(rep, rank) for rep in range(plan.reps)]) for rank in range(len(ranks))
    ]
    bare_wall = pooled("bare", "wall")
    per_step = median([r["collectives_per_step"] for r in ranks[0] if "collectives_per_step" in r])
    return {
        "wall_seconds": {v: pooled(v, "wall") for v in VARIANTS},
        "cpu_seconds": {v: pooled(v, "cpu") for v in STEP_VARIANTS},
        "thread_seconds": {v: pooled(v, "thread") for v in STEP_VARIANTS},
        "wall_ratio": {v: paired(v, "wall") for v in STEP_VARIANTS[1:]},
        "cpu_ratio": {v: paired(v, "cpu") for v in STEP_VARIANTS[1:]},
        "thread_ratio": {v: paired(v, "thread") for v in STEP_VARIANTS[1:]},
        "threads_seconds": {v: _by_thread(ranks[0], v) for v in ("bare", "instrumented")},
        "gc": {v: _gc(ranks[0], v) for v in ("bare", "instrumented")},
        "channel_cost": _channel_cost(bare_wall),
        "counter_cost": _counter_cost(pooled("bare", "cpu"), per_step),
        "exposed_fraction_by_rank": fractions,
        **_ckpt_figures(plan, blocking, [r for r in ranks[0] if r["rep"] >= 0]),
        "hot_path": hot_path_profile(
            collectives=round(per_step) if per_step == per_step else 21,
            steps=40 if plan.reps == 1 else 200,
            rounds=3 if plan.reps == 1 else 7,
        ),
    }


def _by_thread(rank0: list[dict[str, Any]], variant: str) -> dict[str, float]:
    """CPU seconds per timed step by thread, over every repetition of ``variant``."""
    trials = [r for r in rank0 if r["variant"] == variant and r["rep"] >= 0]
    steps = sum(len(r["wall"]) for r in trials) or 1
    total: dict[str, float] = {}
    for trial in trials:
        for name, seconds in trial.get("threads", {}).items():
            total[name] = total.get(name, 0.0) + seconds
    return {name: seconds / steps for name, seconds in total.items()}


def _gc(rank0: list[dict[str, Any]], variant: str) -> dict[str, float]:
    """The garbage collector on rank 0's training thread per timed step, over every repetition
    of ``variant``: its CPU seconds and its collections of each generation."""
    trials = [r for r in rank0 if r["variant"] == variant and r["rep"] >= 0 and "gc" in r]
    steps = sum(len(r["wall"]) for r in trials) or 1
    keys = ("seconds", "gen0", "gen1", "gen2")
    return {k: sum(r["gc"][k] for r in trials) / steps for k in keys}


def _ckpt_figures(plan: Plan, blocking: Any, rank0: list[dict[str, Any]]) -> dict[str, Any]:
    """Checkpoint blocking per save, by span and in all (``checkpoint_save`` +
    ``checkpoint_copy`` + ``checkpoint_commit``), sync and async, per repetition; with
    ``--variants`` of the checkpoint trials alone, also their step wall times."""
    spans = ("checkpoint_save", "checkpoint_copy", "checkpoint_commit")
    ckpt: dict[str, list[float]] = {}
    for variant in ("ckpt-sync", "ckpt-async"):
        for span in spans:
            ckpt[f"{variant}/{span}"] = [blocking(rep, variant, span) for rep in range(plan.reps)]
    sync, async_ = (
        [sum(ckpt[f"{variant}/{span}"][rep] for span in spans) for rep in range(plan.reps)]
        for variant in ("ckpt-sync", "ckpt-async")
    )
    return {
        "ckpt_parts_seconds": {k: median(v) for k, v in ckpt.items()},
        "ckpt_sync_seconds": sync,
        "ckpt_async_seconds": async_,
        "ckpt_ratio": [a / s for a, s in zip(async_, sync, strict=True)],
        "checkpoint_bytes": max(r.get("checkpoint_bytes", 0) for r in rank0),
        "ckpt_wall_seconds": {
            v: median([x for r in rank0 if r["variant"] == v for x in r["wall"]])
            for v in ("ckpt-sync", "ckpt-async")
        },
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


def run_torchrun(work: Path, plan: Plan, timeout: float) -> list[list[dict[str, Any]]]:
    (work / "plan.json").write_text(json.dumps(dataclasses.asdict(plan)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(plan.nproc), str(Path(__file__).resolve()), "--worker", str(work),
    ]  # fmt: skip
    cpus = set(plan.cpus)
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None  # torchrun and its ranks
    done = subprocess.run(command, env=env, timeout=timeout, check=False, cwd=work, preexec_fn=pin)
    if done.returncode != 0:
        raise SystemExit(f"the benchmark's torchrun job failed (exit {done.returncode})")
    return [json.loads((work / f"rank{r}.json").read_text()) for r in range(plan.nproc)]


def _mesh(text: str) -> tuple[int, int]:
    """``--mesh`` ``"DPxTP"`` -> (dp, tp), both >= 1; argparse reports the ValueError."""
    dp, sep, tp = text.lower().partition("x")
    if not sep or not dp.isdigit() or not tp.isdigit() or int(dp) < 1 or int(tp) < 1:
        raise ValueError(text)
    return int(dp), int(tp)


_mesh.__name__ = "mesh (DPxTP, e.g. 2x2 or 1x2)"


def _cpus(text: str) -> tuple[int, ...]:
    """``--cpus`` ``"0"`` or ``"0,1"`` -> the CPU numbers, each one this process may use
    (``os.sched_getaffinity``); argparse reports the ValueError."""
    cpus = tuple(int(part) for part in text.split(","))
    if not cpus or not set(cpus) <= os.sched_getaffinity(0):
        raise ValueError(text)
    return cpus


_cpus.__name__ = f"CPU list (numbers from {sorted(os.sched_getaffinity(0))}, e.g. 0)"


def _mesh_problem(plan: Plan) -> str | None:
    """What the trainer's config refuses in ``plan``'s mesh (the default model's heads must
    split over TP), before torchrun starts; ``None`` when it accepts it."""
    from stormwatch.errors import ConfigError
    from stormwatch.trainer.config import TrainConfig

    try:
        TrainConfig(steps=plan.steps, dp=plan.dp, tp=plan.tp)
    except ConfigError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short repetition (smoke test)")
    parser.add_argument("--reps", type=int, help=f"repetitions (default {Plan.reps})")
    parser.add_argument("--steps", type=int, help=f"steps per trial (default {Plan.steps})")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--variants",
        type=lambda text: tuple(text.split(",")),
        help="comma-separated subset to run: all of them (default), or ckpt-sync,ckpt-async",
    )
    parser.add_argument(
        "--mesh",
        type=_mesh,
        metavar="DPxTP",
        help=f"the job's mesh, FSDP2 ranks x TP ranks (default {Plan.dp}x{Plan.tp}: 4 ranks); "
        "1x2 or 2x1 gives each rank a core of a 2-core machine",
    )
    parser.add_argument(
        "--cpus",
        type=_cpus,
        metavar="N[,N...]",
        help="run the torchrun job on these CPUs only (e.g. 0: every rank shares one core; "
        "`make bench` compares --mesh 1x2 on all cores with --mesh 1x2 --cpus 0)",
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker(args.worker)
    plan = QUICK if args.quick else Plan()
    if args.reps is not None:
        plan = dataclasses.replace(plan, reps=args.reps)
    if args.steps is not None:
        plan = dataclasses.replace(plan, steps=args.steps)
    if args.mesh is not None:
        plan = dataclasses.replace(plan, dp=args.mesh[0], tp=args.mesh[1])
        problem = _mesh_problem(plan)
        if problem:
            parser.error(f"--mesh {plan.dp}x{plan.tp}: {problem}")
    if args.cpus is not None:
        plan = dataclasses.replace(plan, cpus=args.cpus)
    if args.variants is not None:
        if set(args.variants) not in ({"ckpt-sync", "ckpt-async"}, set(VARIANTS)):
            parser.error(f"--variants takes ckpt-sync,ckpt-async or all of {','.join(VARIANTS)}")
        plan = dataclasses.replace(plan, variants=tuple(v for v in VARIANTS if v in args.variants))
    if plan.reps < 1 or plan.steps <= plan.warmup:
        parser.error(f"--reps must be >= 1 and --steps > {plan.warmup} (the warm-up steps)")
    trials = len(plan.trials())
    print(
        f">> {plan.nproc} ranks, {trials} trials ({plan.reps} x {len(plan.variants)} variants, "
        f"{trials - plan.reps * len(plan.variants)} warm-up), "
        f"{plan.steps} steps each ({plan.ckpt_steps} for checkpoints)",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="stormwatch-trainer-bench-"))
    try:
        ranks = run_torchrun(work, plan, timeout=120 + trials * 60)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = aggregate(plan, ranks)
    # the CPUs the ranks could run on, as they saw them (--cpus pins them)
    figures["rank_cpus"] = sorted({c for rank in ranks for r in rank for c in r["cpus"]})
    host = machine()
    on = f"CPU(s) {','.join(map(str, figures['rank_cpus']))} of {os.cpu_count()}"
    title = (
        f"trainer: {plan.nproc} CPU ranks (gloo), dp={plan.dp} x tp={plan.tp}, on {on}, "
        f"{plan.reps} interleaved repetition(s); step = one loop iteration, rank 0"
    )
    report(title, figures, host, ckpt_every=plan.ckpt_every)
    if args.json:
        args.json.write_text(
            json.dumps({"plan": dataclasses.asdict(plan), "machine": host, **figures}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
