#!/usr/bin/env python3
"""Benchmark the agent's render of the ranks' multiprocess files after many rank restarts
against a fresh node, side by side in one run (issue 17, item 4).

Every rank "life" is a real process (forked from this one, so that a thousand of them take
seconds, not minutes) that writes the trainer's whole metric catalogue through
``stormwatch.telemetry.metrics.RankMetrics`` (job info, a few steps, collectives of six
ops on two mesh dimensions, the step breakdown, a checkpoint), then either stays alive (a
running rank) or exits (a rank that was restarted). Folders, each with ``--ranks`` (8)
running ranks of one job:

* ``fresh``: nothing else: a node that never saw a restart;
* ``restarted``: plus ``--restarts`` (1,000) exited rank processes, kept as the agent keeps
  them: live gauges removed (``mark_process_dead``) and the rest folded into the
  accumulator (``TrainerFolder.maintain``, the rank watcher's upkeep);
* ``unfolded``: the same exited processes without the fold (the agent before issue 17:
  every file of every restart merged at every read);
* ``fresh-again``: ``fresh`` once more: the A/A comparison that shows how far two
  identical folders differ on this machine (the noise floor).

Measured per folder, the variants interleaved in every repetition (their order rotating):
the agent's render of the ``trainer`` collector (``CollectorSet([TrainerCollector]).render()``,
what ``/metrics`` spends on these files; CPU time of the rendering thread, the steady
figure on a shared machine, and wall time) and the rank-health read of the collective
counters (``TrainerFiles.read(COUNTERS, ...)``, every 0.5 s; CPU time). Ratios are the
median over repetitions of each repetition's ratio of medians (variant / fresh), with
min..max. The target is ``restarted / fresh <= 1.5`` for the render's CPU time; the
output says whether it was met.

Usage::

    .venv/bin/python benchmarks/scrape_bench.py [--quick] [--reps 5] [--renders 20]
        [--ranks 8] [--restarts 1000] [--json F]

A trial renders ``--renders`` times, or fewer (3 at least) once it took 1 s. Takes about 2
minutes on 2 idle cores, most of it forking the thousand rank lives and rendering the
unfolded folder (``--quick``: 50 restarts and short trials, well under a minute, for the
test). Everything runs in a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.multiprocess import mark_process_dead
from trainer_bench import machine
from trainer_report import median

from stormwatch.agent.collectors import CollectorSet, TrainerCollector
from stormwatch.agent.watch.folder import TrainerFolder
from stormwatch.agent.watch.procs import pid_dead
from stormwatch.agent.watch.trainer_files import CALLS_SAMPLE, COUNTERS, TrainerFiles, add

VARIANTS = ("fresh", "restarted", "unfolded", "fresh-again")
JOB = "bench"
OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "barrier")
#: The render must stay within this factor of a fresh node's (issue 17, item 4).
TARGET_RATIO = 1.5


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the benchmark runs."""

    reps: int = 5
    renders: int = 20  # at most, per variant and repetition ...
    trial_seconds: float = 1.0  # ... or fewer once a trial took this long (3 at least)
    ranks: int = 8
    restarts: int = 1000


#: ``--quick``: every path once, fast (the test).
QUICK = Plan(reps=2, renders=5, trial_seconds=0.2, ranks=4, restarts=50)


def rank_life(folder: Path, rank: int, attempt: int) -> None:
    """What one rank process writes (in the child: the metric objects are its own)."""
    from stormwatch.telemetry.metrics import RankMetrics

    metrics = RankMetrics(folder, job=JOB, rank=rank)
    now = time.time()
    metrics.job_info(world_size=8, node_restarts=attempt)
    metrics.started(step=0, timestamp=now)
    for step in range(1, 4):
        metrics.step(step=step, loss=2.0 / step, seconds=0.1, tokens=4096, timestamp=now + step)
        metrics.breakdown(compute_seconds=0.07, wait_seconds=0.03)
        for dim in ("dp_shard", "tp"):
            for op in OPS:
                metrics.collective(mesh_dim=dim, op=op, size=1 << 20, seconds=0.001)
                metrics.collective_issued(op, 1 << 20)
                metrics.collective_completed(op, 0.001)
                metrics.bandwidth(mesh_dim=dim, op=op, algbw=1e9, busbw=1.5e9)
    metrics.checkpoint_committed(timestamp=now + 4)


def fork_life(folder: Path, rank: int, attempt: int, *, stay: bool) -> int:
    """Run :func:`rank_life` in a forked child; with ``stay`` it then waits for SIGTERM,
    else it exits. Returns the child's pid (reaped here when it exits)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one rank process
        code = 0
        try:
            os.close(read)
            rank_life(folder, rank, attempt)
            os.write(write, b"1")
            if stay:  # a SIGTERM before the mask ends the child as well
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                signal.sigwait({signal.SIGTERM})
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    written = os.read(read, 1)
    os.close(read)
    if not written:
        raise SystemExit(f"rank {rank} attempt {attempt} failed to write its metrics")
    if not stay:
        os.waitpid(pid, 0)
    return pid


@contextlib.contextmanager
def running_ranks() -> Iterator[list[int]]:
    """Pids of the ranks left running; all stopped at the end."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def build(work: Path, plan: Plan, pids: list[int]) -> dict[str, TrainerFolder]:
    """The four folders (module docstring), their running ranks added to ``pids``. The
    exited ranks' files are written once, into ``unfolded``, and copied to ``restarted``."""
    paths = {variant: work / variant for variant in VARIANTS}
    for path in paths.values():
        path.mkdir()
    for n in range(plan.restarts):
        exited = fork_life(paths["unfolded"], n % plan.ranks, 1 + n // plan.ranks, stay=False)
        mark_process_dead(exited, str(paths["unfolded"]))
    for path in paths["unfolded"].iterdir():
        shutil.copyfile(path, paths["restarted"] / path.name)
    folders: dict[str, TrainerFolder] = {}
    for variant, path in paths.items():
        restarted = variant in ("restarted", "unfolded")
        attempt = 1 + plan.restarts // plan.ranks if restarted else 0
        pids += [fork_life(path, r, attempt, stay=True) for r in range(plan.ranks)]
        folders[variant] = TrainerFolder(path)
    folders["restarted"].maintain(pid_dead, {})
    return folders


def timed(call: Callable[[], object], plan: Plan) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds (this thread's) per call: ``plan.renders`` calls, or fewer (3 at
    least) once they took ``plan.trial_seconds`` (the unfolded folder's take seconds each)."""
    wall: list[float] = []
    cpu: list[float] = []
    while len(wall) < plan.renders and (len(wall) < 3 or sum(wall) < plan.trial_seconds):
        started, started_cpu = time.perf_counter(), time.thread_time()
        call()
        cpu.append(time.thread_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    return wall, cpu


def measure(plan: Plan, folders: dict[str, TrainerFolder]) -> dict[str, Any]:
    """Per repetition and variant: median render and counter-read seconds; the figures."""
    renders = {v: CollectorSet([TrainerCollector(f)]) for v, f in folders.items()}
    readers = {v: TrainerFiles(f.path, reader="bench", folder=f) for v, f in folders.items()}
    per: dict[str, dict[str, list[float]]] = {"render": {}, "render_wall": {}, "counters": {}}
    for rep in range(plan.reps):
        shift = rep % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            wall, cpu = timed(renders[variant].render, plan)
            _, read = timed(
                lambda v=variant: readers[v].read(COUNTERS, (CALLS_SAMPLE,), combine=add), plan
            )
            per["render"].setdefault(variant, []).append(median(cpu))
            per["render_wall"].setdefault(variant, []).append(median(wall))
            per["counters"].setdefault(variant, []).append(median(read))
    figures: dict[str, Any] = {"files": {v: len(f.paths()) for v, f in folders.items()}}
    for kind, by_variant in per.items():
        figures[f"{kind}_seconds"] = {v: median(s) for v, s in by_variant.items()}
        figures[f"{kind}_ratio"] = {
            v: [a / b for a, b in zip(by_variant[v], by_variant["fresh"], strict=True)]
            for v in VARIANTS[1:]
        }
    ratio = median(figures["render_ratio"]["restarted"])
    figures["target"] = {"ratio": ratio, "limit": TARGET_RATIO, "met": ratio <= TARGET_RATIO}
    return figures


def report(title: str, plan: Plan, figures: dict[str, Any], host: dict[str, str]) -> None:
    """Print the table (rich), the target line and the machine line."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("measure", "fresh", "measured", "ratio (median)", "min..max"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    restarts = f"{plan.restarts:,} restarts"
    rows = (
        (f"render CPU after {restarts}, folded / fresh node", "restarted", "render"),
        (f"render CPU after {restarts}, unfolded (before the fold) / fresh", "unfolded", "render"),
        ("noise floor (A/A): render CPU, fresh again / fresh", "fresh-again", "render"),
        (f"render wall after {restarts}, folded / fresh node", "restarted", "render_wall"),
        ("noise floor (A/A): render wall, fresh again / fresh", "fresh-again", "render_wall"),
        (f"rank-health counter read CPU after {restarts}, folded / fresh", "restarted", "counters"),
        ("rank-health counter read CPU, unfolded / fresh", "unfolded", "counters"),
        ("noise floor (A/A): counter read CPU, fresh again / fresh", "fresh-again", "counters"),
    )
    for label, variant, kind in rows:
        ratios = figures[f"{kind}_ratio"][variant]
        seconds = figures[f"{kind}_seconds"]
        table.add_row(
            label,
            f"{seconds['fresh'] * 1000:.2f} ms",
            f"{seconds[variant] * 1000:.2f} ms",
            f"{median(ratios):.3f}",
            f"{min(ratios):.3f}..{max(ratios):.3f}",
        )
    Console(width=150).print(table)
    files = figures["files"]
    print("files in the folder: " + ", ".join(f"{v} {n}" for v, n in files.items()))
    target = figures["target"]
    verdict = "met" if target["met"] else "MISSED"
    print(
        f"target: render after {restarts} within {target['limit']}x of a fresh node (CPU "
        f"time): ratio {target['ratio']:.3f}, {verdict}"
    )
    print("machine: " + ", ".join(f"{k} {v}" for k, v in host.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    parser.add_argument("--reps", type=int, help=f"repetitions (default {Plan.reps})")
    parser.add_argument("--renders", type=int, help=f"renders per trial (default {Plan.renders})")
    parser.add_argument("--ranks", type=int, help=f"running ranks (default {Plan.ranks})")
    parser.add_argument("--restarts", type=int, help=f"exited ranks (default {Plan.restarts})")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    for name in ("reps", "renders", "ranks", "restarts"):
        if getattr(args, name) is not None:
            plan = dataclasses.replace(plan, **{name: getattr(args, name)})
    if min(plan.reps, plan.renders, plan.ranks) < 1 or plan.restarts < 0:
        parser.error("--reps, --renders and --ranks must be >= 1, --restarts >= 0")
    for name in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir"):
        os.environ.pop(name, None)
    # Stopped by a signal, the running ranks are still ended (the finally blocks below),
    # also when started in the background, where SIGINT is ignored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(
        f">> {plan.ranks} running ranks per folder, {plan.restarts} rank restarts, "
        f"{plan.reps} x {len(VARIANTS)} interleaved trials of up to {plan.renders} renders",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="stormwatch-scrape-bench-"))
    started = time.monotonic()
    try:
        with running_ranks() as pids:
            folders = build(work, plan, pids)
            built = time.monotonic() - started
            figures = measure(plan, folders)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    host = machine()
    title = (
        f"The agent's render of the ranks' multiprocess files: {plan.ranks} running ranks, "
        f"after {plan.restarts:,} rank restarts vs a fresh node; {plan.reps} interleaved "
        f"repetition(s) of up to {plan.renders} renders (set-up {built:.0f} s, "
        f"total {time.monotonic() - started:.0f} s)"
    )
    report(title, plan, figures, host)
    if args.json:
        args.json.write_text(
            json.dumps({"plan": dataclasses.asdict(plan), "machine": host, **figures}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
