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
example's ``--step-times``: wall and process CPU time, all threads), after ``warmup``
steps. Ratios are the median over repetitions of each repetition's ratio of medians
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

from trainer_bench import machine
from trainer_report import median

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning" / "train.py"
NPROC = 2
VARIANTS = ("bare", "stormwatch", "bare-again")


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
    shutil.rmtree(trial, ignore_errors=True)
    return {kind: times[kind][plan.warmup :] for kind in ("wall", "cpu")}


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
    for kind in ("wall", "cpu"):
        figures[f"{kind}_seconds"] = {v: pooled(v, kind) for v in VARIANTS}
        figures[f"{kind}_ratio"] = {v: paired(v, kind) for v in VARIANTS[1:]}
        figures[f"{kind}_overhead_seconds"] = pooled("stormwatch", kind) - pooled("bare", kind)
    return figures


def report(title: str, figures: dict[str, Any], host: dict[str, str]) -> None:
    """Print the table (rich) and the machine line."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("measure", "bare", "measured", "ratio (median)", "min..max"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    rows = (
        ("overhead: step wall time, stormwatch / bare", "stormwatch", "wall"),
        ("overhead: step CPU time, stormwatch / bare", "stormwatch", "cpu"),
        ("noise floor (A/A): wall, bare again / bare", "bare-again", "wall"),
        ("noise floor (A/A): CPU, bare again / bare", "bare-again", "cpu"),
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
        f"{figures['wall_overhead_seconds'] * 1e6:.0f} us, CPU "
        f"{figures['cpu_overhead_seconds'] * 1e6:.0f} us"
    )
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
