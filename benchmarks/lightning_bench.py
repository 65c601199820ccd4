#!/usr/bin/env python3
"""Benchmark the telemetry API on a PyTorch Lightning job: the job with
``StormwatchCallback`` against the same job without it, side by side in one run.

The job is examples/lightning/train.py (a three-layer MLP, DDP over gloo on the CPU),
2 ranks under torchrun, no checkpoints. Every trial is one short training run in its own
torchrun (the API's collective kernels and exit hooks are process-wide, so a run without
the callback must be a process that never had it); the variants are interleaved in every
repetition, their order rotating, so all of them see the same machine load:

* ``bare``: ``--no-stormwatch``, the job as its author wrote it;
* ``stormwatch``: with the callback, as on the lab: metrics (prometheus-client
  multiprocess files), the event log, collective counting, the flight recorder, the
  gradient norm, the SIGTERM watch (``STORMWATCH_METRICS_DIR``/``LOG_DIR``/``DUMP_DIR``
  in a temporary folder);
* ``bare-again``: ``bare`` once more: the A/A comparison that shows how far two identical
  variants differ on this machine (the noise floor).

A step is one optimizer step of rank 0, from one ``on_train_batch_end`` to the next (the
example's ``--step-times``: wall time, process CPU time (all threads) and the training
thread's CPU time, which the telemetry's flusher thread is not part of), after ``warmup``
steps. Then the floor: the API's step mark with the example's two collectives counted
and the callback's gradient norm, timed directly on one thread
(``hotpath_profile.py --style api``), with the profile of where that time goes. Ratios are the median over repetitions of each repetition's ratio of medians
(variant / bare), with their min..max; the overhead per step is the difference of the
medians pooled over all repetitions. No figure is judged: the table is for people;
docs/instrument-your-job.md "PyTorch Lightning" records a run.

Usage::

    .venv/bin/python benchmarks/lightning_bench.py [--quick] [--reps 5] [--steps 300]
        [--width 256] [--batch-size 64] [--json F]

Takes about 5 minutes on 2 shared cores (``--quick``: one repetition of short trials,
about a minute, for the end-to-end test). Everything runs in a temporary directory that is
removed afterwards.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hotpath_profile import in_child as hot_path_profile
from hotpath_profile import summary
from trainer_bench import machine
from trainer_report import gpu_projection, median

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning" / "train.py"
#: The example's StormwatchCallback hooks timed per step (its STEP_HOOKS).
STEP_HOOKS = ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end")
NPROC = 2
VARIANTS = ("bare", "stormwatch", "bare-again")
#: wall time, process CPU time (all threads), the training thread's CPU time
KINDS = ("wall", "cpu", "thread")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the benchmark runs."""

    reps: int = 5
    steps: int = 300
    warmup: int = 20
    width: int = 256  # the example's defaults: a small job, where a fixed cost shows most
    batch_size: int = 64

    def trials(self) -> list[tuple[int, str]]:
        """(repetition, variant) in run order, the variants rotating per repetition."""
        out = []
        for rep in range(self.reps):
            shift = rep % len(VARIANTS)
            out += [(rep, v) for v in VARIANTS[shift:] + VARIANTS[:shift]]
        return out


#: ``--quick``: every path once, as fast as possible (the end-to-end test).
QUICK = Plan(reps=1, steps=25, warmup=5)


def run_trial(work: Path, plan: Plan, variant: str, timeout: float) -> dict[str, list[float]]:
    """One torchrun of the example; rank 0's step times after the warm-up (``hooks``: the
    callback's per-step hooks, timed on the training thread; with it, its collectives per
    step)."""
    """One torchrun of the example; rank 0's step times after the warm-up."""
    trial = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=work))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "SLURM_"))}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    args = [str(EXAMPLE), "--max-steps", str(plan.steps), "--checkpoint-every", "0"]
    args += ["--width", str(plan.width), "--batch-size", str(plan.batch_size)]
    args += ["--step-times", str(trial / "steps.json")]
    if variant == "stormwatch":
        for name, folder in (("METRICS", "metrics"), ("LOG", "logs"), ("DUMP", "dumps")):
            (trial / folder).mkdir()
            env[f"STORMWATCH_{name}_DIR"] = str(trial / folder)
        env["STORMWATCH_JOB"] = "bench"
    else:
        args.append("--no-stormwatch")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(NPROC), *args]
    done = subprocess.run(
        command, env=env, cwd=trial, timeout=timeout, check=False, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(
            f"the {variant} trial failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    times = json.loads((trial / "steps.json").read_text())
    result = {kind: times[kind][plan.warmup :] for kind in (*KINDS, "hooks")}
    if variant == "stormwatch":  # rank 0's collectives per step, as it counted them
        calls = _collective_calls(trial / "metrics")
        result["collectives_per_step"] = [calls / plan.steps]
    shutil.rmtree(trial, ignore_errors=True)
    return result


def _collective_calls(metrics_dir: Path) -> float:
    """Rank 0's ``stormwatch_collective_calls_total``, all ops."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    return sum(
        s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "stormwatch_collective_calls_total" and s.labels.get("rank") == "0"
    )


def aggregate(plan: Plan, results: dict[tuple[int, str], dict[str, list[float]]]) -> dict[str, Any]:
    """Per-trial step times -> the figures of the table (module docstring)."""

    def pooled(variant: str, kind: str) -> float:
        return median([x for (_, v), r in results.items() if v == variant for x in r[kind]])

    def paired(variant: str, kind: str) -> list[float]:
        return [
            median(results[rep, variant][kind]) / median(results[rep, "bare"][kind])
            for rep in range(plan.reps)
        ]

    figures: dict[str, Any] = {}
    for kind in KINDS:
        figures[f"{kind}_seconds"] = {v: pooled(v, kind) for v in VARIANTS}
        figures[f"{kind}_ratio"] = {v: paired(v, kind) for v in VARIANTS[1:]}
        figures[f"{kind}_overhead_seconds"] = pooled("stormwatch", kind) - pooled("bare", kind)
    figures["hook_seconds"] = pooled("stormwatch", "hooks")
    figures["collectives_per_step"] = pooled("stormwatch", "collectives_per_step")
    return figures


def _grad_norm_seconds(width: int, rounds: int = 2000) -> float:
    """The callback's gradient norm (``on_before_optimizer_step``) over the example's
    parameters (``FEATURES`` -> ``width`` -> ``width`` -> 1), seconds per step."""
    import torch

    shapes = [(width, 32), (width,), (width, width), (width,), (1, width), (1,)]
    grads = [torch.randn(shape) for shape in shapes]
    started = time.thread_time()
    for _ in range(rounds):
        float(torch.nn.utils.get_total_norm(grads))
    return (time.thread_time() - started) / rounds


def floor(plan: Plan) -> dict[str, Any]:
    """What the callback costs a step at the least, timed directly on one thread: the
    API's step mark with the example's two collectives per step counted (Lightning's
    SIGTERM broadcast and DDP's all-reduce; ``hotpath_profile.py --style api``) plus the
    gradient norm."""
    quick = plan.reps == 1
    hot = hot_path_profile(
        collectives=2, steps=50 if quick else 300, rounds=3 if quick else 7, style="api"
    )
    grad = _grad_norm_seconds(plan.width)
    return {"hot_path": hot, "grad_norm_seconds": grad, "seconds": hot["overhead_seconds"] + grad}


def report(title: str, figures: dict[str, Any], host: dict[str, str]) -> None:
    """Print the table (rich) and the machine line."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("measure", "bare", "measured", "ratio (median)", "min..max"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    rows = (
        ("overhead: step wall time, stormwatch / bare", "stormwatch", "wall"),
        ("overhead: training thread's CPU time, stormwatch / bare", "stormwatch", "thread"),
        ("overhead: process CPU time (all threads), stormwatch / bare", "stormwatch", "cpu"),
        ("noise floor (A/A): wall, bare again / bare", "bare-again", "wall"),
        ("noise floor (A/A): training thread's CPU, bare again / bare", "bare-again", "thread"),
        ("noise floor (A/A): process CPU, bare again / bare", "bare-again", "cpu"),
    )
    for label, variant, kind in rows:
        ratios = figures[f"{kind}_ratio"][variant]
        seconds = figures[f"{kind}_seconds"]
        table.add_row(
            label,
            f"{seconds['bare'] * 1000:.2f} ms",
            f"{seconds[variant] * 1000:.2f} ms",
            f"{median(ratios):.3f}",
            f"{min(ratios):.3f}..{max(ratios):.3f}",
        )
    Console(width=150).print(table)
    print(
        f"overhead per step (pooled medians): wall "
        f"{figures['wall_overhead_seconds'] * 1e6:.0f} us, training thread CPU "
        f"{figures['thread_overhead_seconds'] * 1e6:.0f} us, process CPU "
        f"{figures['cpu_overhead_seconds'] * 1e6:.0f} us"
    )
    bare = figures["thread_seconds"]["bare"]
    hooks = figures["hook_seconds"]
    print(
        f"in situ, rank 0: the callback's per-step hooks ({', '.join(STEP_HOOKS)}) took "
        f"{hooks * 1e6:.0f} us of the training thread per step (median), "
        f"{hooks / bare:.3f} of the bare step; {figures['collectives_per_step']:.1f} "
        "collectives counted per step"
    )
    floor = figures.get("floor")
    if floor is not None:
        print(
            f"the per-step floor, timed directly on the training thread: the API's step "
            f"with its {floor['hot_path']['collectives_per_step']} collectives counted "
            f"{floor['hot_path']['overhead_seconds'] * 1e6:.0f} us, the callback's "
            f"gradient norm {floor['grad_norm_seconds'] * 1e6:.0f} us: "
            f"{floor['seconds'] * 1e6:.0f} us = {floor['seconds'] / bare:.3f} of this bare "
            f"step's training-thread CPU ({bare * 1e3:.2f} ms); 1.02 needs a step of "
            f"{floor['seconds'] / 0.02 * 1e3:.1f} ms or more"
        )
        print(gpu_projection(floor["seconds"], bare))
        print("where the API's cost remains on the training thread:")
        print(summary(floor["hot_path"]))
    print("machine: " + ", ".join(f"{k} {v}" for k, v in host.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short repetition (smoke test)")
    parser.add_argument("--reps", type=int, help=f"repetitions (default {Plan.reps})")
    parser.add_argument("--steps", type=int, help=f"steps per trial (default {Plan.steps})")
    parser.add_argument("--width", type=int, help=f"hidden units (default {Plan.width})")
    parser.add_argument(
        "--batch-size", type=int, help=f"samples per rank and step (default {Plan.batch_size})"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    for name in ("reps", "steps", "width", "batch_size"):
        if getattr(args, name) is not None:
            plan = dataclasses.replace(plan, **{name: getattr(args, name)})
    if plan.reps < 1 or plan.steps <= plan.warmup + 1:
        parser.error(f"--reps must be >= 1 and --steps > {plan.warmup + 1} (warm-up steps + 1)")
    trials = plan.trials()
    print(
        f">> Lightning, {NPROC} CPU ranks (gloo, DDP): {len(trials)} trials "
        f"({plan.reps} x {len(VARIANTS)} variants), {plan.steps} steps each",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="stormwatch-lightning-bench-"))
    started = time.monotonic()
    try:
        results = {(rep, v): run_trial(work, plan, v, timeout=300) for rep, v in trials}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = aggregate(plan, results)
    figures["floor"] = floor(plan)
    host = machine()
    title = (
        f"Lightning job (width {plan.width}, batch {plan.batch_size}), StormwatchCallback vs "
        f"none: {NPROC} CPU ranks, {plan.reps} interleaved "
        f"repetition(s) of {plan.steps - plan.warmup} timed steps; step = one optimizer step, "
        f"rank 0 ({time.monotonic() - started:.0f} s)"
    )
    report(title, figures, host)
    if args.json:
        args.json.write_text(
            json.dumps({"plan": dataclasses.asdict(plan), "machine": host, **figures}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
