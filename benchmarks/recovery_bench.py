#!/usr/bin/env python3
"""Benchmark recovery: a rank SIGKILLed, to the first step after torchrun restarts the job.

Each trial runs ``stormwatch train`` (default model, checkpoints every
:data:`CKPT_EVERY` steps) as the lab runs it, on this machine: two torchrun agents
("nodes") of two ranks each on loopback, world size 4 (dp=2 x tp=2), c10d rendezvous
hosted by node 0 with the lab's ``--nnodes 1:2``, ``--rdzv-conf``, ``--max-restarts`` and
``--monitor-interval`` (:mod:`stormwatch.lab.jobs.torchrun`) and its environment
(``OMP_NUM_THREADS=1``, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``). After step
:data:`KILL_AFTER` the benchmark SIGKILLs rank 1 (as ``experiments/kill-rank.yaml`` does)
and times, from the kill:

* ``old workers all exited``: the last of the old workers gone from its torchrun's
  children (the survivors failed in a collective or were SIGTERMed by torchrun, wrote
  their post-mortem dumps, exited and were reaped); polled every :data:`POLL` seconds;
* ``new workers started``: the first new worker's process start (the kernel's, psutil);
* each part of the new ranks' start-up, from the trainer's own timeline
  (:mod:`stormwatch.trainer.startup`: ``cli``, ``imports``, ``telemetry``, ``rendezvous``,
  ``mesh``, ``data``, ``parallelize``, ``checkpoint_load``; its log record with
  ``--log-format json``): when the slowest rank ended it, and its seconds (mean of the ranks);
* ``first step``: rank 0's first step record after the kill (``rank0.jsonl``; the
  step's end; the kill-to-first-step time the issue targets at <= 5 s);
* CPU seconds each new rank used until then (psutil, all threads), and the torchrun
  agents' CPU over the trial (share of one core);
* the CPU seconds of a fresh interpreter that imports the training loop and exits, with
  the garbage collector as it is and as the CLI imports (paused, then frozen): what a
  rank cannot do in less wall time than its CPU time when four of them share two cores.

Variants, interleaved in each repetition (their order rotating): ``lab`` (as the lab
launches) and ``lab-again`` (identical: the A/A row, the noise floor); ``--before DIR``
adds ``before``, the same job with the ``torchrun`` and ``stormwatch`` of another
installation (e.g. the main branch's ``.venv/bin``), ``--monitor S`` a variant with
torchrun's ``--monitor-interval S``. Figures are medians with min..max over
repetitions. No assertion is made on any figure; the last lines give the 2-core floor
(ranks x CPU per rank / cores), the estimate with a core per rank, and the target.

Usage::

    .venv/bin/python benchmarks/recovery_bench.py [--quick] [--reps 3] [--json out.json]
        [--before ../main/.venv/bin] [--monitor 0.1]

About 5 minutes on 2 shared cores at load 11 (``--quick``: one repetition, about 2
minutes; each variant adds a trial per repetition, about 40 s).
Everything runs in a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from stormwatch.lab.jobs.elastic import ELASTIC_RDZV_CONF
from stormwatch.lab.jobs.torchrun import MONITOR_INTERVAL
from stormwatch.telemetry.events import read_events

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
NODES, NPROC = 2, 2
KILL_AFTER = 7  # after the checkpoint of step 5: steps 6.. are recomputed, as in the demo
CKPT_EVERY = 5
POLL = 0.05
TRIAL_TIMEOUT = 240.0
PARTS = ("cli", "imports", "telemetry", "rendezvous", "mesh", "data", "parallelize")
PARTS += ("checkpoint_load",)


@dataclass(frozen=True)
class Variant:
    """One way of launching the job: extra ``--rdzv-conf`` entries, environment, and the
    folder of the ``torchrun`` and ``stormwatch`` to run (default: this interpreter's)."""

    name: str
    rdzv_conf: dict[str, object] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    bin: Path = BIN
    monitor_interval: float = MONITOR_INTERVAL


VARIANTS = (Variant("lab"), Variant("lab-again"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _torchrun(variant: Variant, node: int, port: int, run: Path) -> list[str]:
    """One node's torchrun command line, as :func:`stormwatch.lab.jobs.torchrun.torchrun_command`."""
    conf = {"is_host": 1 if node == 0 else 0, **ELASTIC_RDZV_CONF, **variant.rdzv_conf}
    return [
        str(variant.bin / "torchrun"),
        *("--nnodes", f"1:{NODES}", "--nproc-per-node", str(NPROC), "--node-rank", str(node)),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"),
        *("--rdzv-id", "recovery", "--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items())),
        *("--local-addr", "127.0.0.1", "--max-restarts", "3"),
        *("--monitor-interval", str(variant.monitor_interval), "--no-python"),
        str(variant.bin / "stormwatch"),
        *("-v", "--log-format", "json", "train", "--dp", "auto", "--tp", str(NPROC)),
        *("--steps", "10000", "--global-batch", "8", "--checkpoint-every", str(CKPT_EVERY)),
        *("--job", "recovery", "--log-dir", str(run / "logs")),
        *("--checkpoint-dir", str(run / "ckpt"), "--metrics-dir", str(run / f"metrics{node}")),
        "--quiet",
    ]


def _steps(log: Path, since: float = 0.0) -> list[Any]:
    """Step records of ``log`` written after the first start record later than ``since``."""
    if not log.exists():
        return []
    events = read_events(log)
    starts = [i for i, e in enumerate(events) if e.event == "start" and e.time > since]
    return [e for e in events[starts[0] :] if e.event == "step"] if starts else []


def _wait(what: str, check: Any, deadline: float, agents: list[subprocess.Popen[bytes]]) -> Any:
    while True:
        found = check()
        if found:
            return found
        if time.time() > deadline or any(a.poll() is not None for a in agents):
            raise RuntimeError(f"trial failed waiting for {what}")
        time.sleep(POLL)


@contextlib.contextmanager
def _agents(variant: Variant, run: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    port = _free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        **variant.env,
    }
    for name in ("STORMWATCH_METRICS_DIR", "STORMWATCH_CONTROL_DIR", "STORMWATCH_OTLP_ENDPOINT"):
        env.pop(name, None)
    agents: list[subprocess.Popen[bytes]] = []
    try:
        for node in range(NODES):
            with (run / f"node{node}.err").open("wb") as err:
                agents.append(
                    subprocess.Popen(
                        _torchrun(variant, node, port, run),
                        cwd=run,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                        start_new_session=True,
                    )
                )
        yield agents
    finally:
        for agent in agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGTERM)
        for agent in agents:
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()


def _workers(agents: list[subprocess.Popen[bytes]]) -> dict[int, psutil.Process]:
    out = {}
    for agent in agents:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(agent.pid).children():
                out[child.pid] = child
    return out


def _startup_records(run: Path, since: float) -> list[dict[str, Any]]:
    """The trainer's start-up timelines logged by processes started after ``since``."""
    records = []
    for node in range(NODES):
        for line in (run / f"node{node}.err").read_text(errors="replace").splitlines():
            if not line.startswith("{") or "startup_seconds" not in line:
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record["process_start"] >= since - 0.05:
                    records.append(record)
    return records


def trial(variant: Variant, run: Path) -> dict[str, Any]:
    """One kill and recovery; seconds from the kill (see the module docstring)."""
    run.mkdir(parents=True)
    logs = run / "logs"
    deadline = time.time() + TRIAL_TIMEOUT
    with _agents(variant, run) as agents:
        began = time.time()
        _wait("step", lambda: len(_steps(logs / "rank1.jsonl")) >= KILL_AFTER, deadline, agents)
        old = _workers(agents)
        victim = [e for e in read_events(logs / "rank1.jsonl") if e.event == "start"][-1].pid
        killed = time.time()
        os.kill(victim or 0, signal.SIGKILL)
        gone: float | None = None
        exits: dict[int, float] = {}
        new: dict[int, psutil.Process] = {}
        cpu: dict[int, float] = {}
        first: Any = None
        while first is None:
            if time.time() > deadline:
                raise RuntimeError(f"no step after the kill in {TRIAL_TIMEOUT} s")
            now = time.time()
            live = _workers(agents)
            for pid in set(old) - set(live) - set(exits):
                exits[pid] = now - killed
            if gone is None and not set(old) & set(live):
                gone = now
            for pid, proc in live.items():
                if pid not in old:
                    new.setdefault(pid, proc)
                    with contextlib.suppress(psutil.Error):
                        cpu[pid] = _cpu(proc)
            after = _steps(logs / "rank0.jsonl", since=killed)
            first = after[0] if after else None
            time.sleep(POLL)
        agent_cpu = sum(_cpu(psutil.Process(a.pid)) for a in agents) / (time.time() - began)
    if gone is None:
        raise RuntimeError("the old workers did not all exit")
    starts = sorted(p.create_time() - killed for p in new.values())
    return {
        "survivors_stopped": gone - killed,
        "old_exits": sorted(exits.values()),
        "workers_started": starts[0],
        "workers_started_last": starts[-1],
        **_breakdown(_startup_records(run, killed), killed),
        "first_step": first.time - killed,
        "first_step_seconds": first.step_seconds or 0.0,
        "cpu_per_rank": statistics.mean(cpu.values()) if cpu else 0.0,
        "agent_cpu_share": agent_cpu,
    }


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _breakdown(records: list[dict[str, Any]], killed: float) -> dict[str, Any]:
    """Per part: when the slowest rank ended it (seconds after the kill), and its wall and
    CPU seconds (mean of the ranks); empty for a trainer that logs no timeline."""
    if len(records) != NODES * NPROC:
        return {}

    def mean(key: str, part: str) -> float:
        return statistics.mean(r[key].get(part, 0.0) for r in records)

    return {
        "ends": {
            p: max(r["process_start"] + _until(r, p) for r in records) - killed for p in PARTS
        },
        "parts": {p: mean("startup_seconds", p) for p in PARTS},
        "cpu": {p: mean("startup_cpu_seconds", p) for p in PARTS},
    }


def _until(record: dict[str, Any], part: str) -> float:
    """Seconds from the process start to the end of ``part`` in a start-up record."""
    total = 0.0
    for name, seconds in record["startup_seconds"].items():
        total += seconds
        if name == part:
            break
    return total


IMPORTS = "import stormwatch.trainer.loop"
IMPORTS_AS_THE_CLI = (
    "from stormwatch.trainer.startup import imports_without_gc\n"
    "with imports_without_gc():\n    import stormwatch.trainer.loop"
)


def import_cost(runs: int) -> dict[str, float]:
    """CPU seconds of a fresh interpreter that imports the training loop and exits, with
    the garbage collector as it is (``plain``) and as the CLI imports (``cli``: paused,
    then frozen; :func:`stormwatch.trainer.startup.imports_without_gc`), interleaved; the
    median of ``runs``."""
    cpu: dict[str, list[float]] = {"plain": [], "cli": []}
    for _ in range(runs):
        for name, code in (("plain", IMPORTS), ("cli", IMPORTS_AS_THE_CLI)):
            before = os.times()
            subprocess.run([sys.executable, "-c", code], check=True)
            after = os.times()
            used = after.children_user - before.children_user
            cpu[name].append(used + after.children_system - before.children_system)
    return {name: statistics.median(values) for name, values in cpu.items()}


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f})"


def _median(trials: list[dict[str, Any]], key: str) -> float:
    return statistics.median(t[key] for t in trials)


def report(results: dict[str, list[dict[str, Any]]], imports: dict[str, float], reps: int) -> None:
    """Print the tables (medians, min-max over repetitions)."""
    base = results["lab"]
    print(f"\nrecovery: SIGKILL of rank 1 -> first step after the restart; {reps} repetition(s); "
          f"2 torchrun nodes x 2 ranks on loopback (world 4, dp=2 x tp=2), the lab's settings")  # fmt: skip
    print(f"{'breakdown (lab)':<38} {'ends after the kill':>24} {'wall, mean of ranks':>24} "
          f"{'CPU, mean of ranks':>24}")  # fmt: skip
    rows: list[tuple[str, list[float], list[float] | None, list[float] | None]] = [
        ("old workers all exited", [t["survivors_stopped"] for t in base], None, None),
        ("new workers started", [t["workers_started"] for t in base], None, None),
    ]
    if all("ends" in t for t in base):
        for part in PARTS:
            rows.append((f"  {part}", [t["ends"][part] for t in base],
                         [t["parts"][part] for t in base], [t["cpu"][part] for t in base]))  # fmt: skip
    rows.append(("first step after the restart", [t["first_step"] for t in base], None, None))
    rows.append(("  of which the step", [t["first_step_seconds"] for t in base], None, None))
    for label, ends, parts, cpu_parts in rows:
        print(f"{label:<38} {_fmt(ends):>24} {'' if parts is None else _fmt(parts):>24} "
              f"{'' if cpu_parts is None else _fmt(cpu_parts):>24}")  # fmt: skip
    print()
    print(f"{'variant':<16} {'kill -> first step':>24} {'ratio to lab':>20} "
          f"{'old workers exited':>24} {'new started':>24} {'CPU per new rank':>24} "
          f"{'torchrun agents CPU':>20}")  # fmt: skip
    for name, trials in results.items():
        ratios = [t["first_step"] / b["first_step"] for t, b in zip(trials, base, strict=True)]
        label = "A/A: lab-again" if name == "lab-again" else name
        print(f"{label:<16} {_fmt([t['first_step'] for t in trials]):>24} "
              f"{statistics.median(ratios):>9.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
              f"{_fmt([t['survivors_stopped'] for t in trials]):>24} "
              f"{_fmt([t['workers_started'] for t in trials]):>24} "
              f"{_fmt([t['cpu_per_rank'] for t in trials]):>24} "
              f"{100 * _median(trials, 'agent_cpu_share'):>17.1f} %")  # fmt: skip
    print(f"\nimport of the training loop + exit, one process, CPU: {imports['plain']:.2f} s with "
          f"the GC as it is, {imports['cli']:.2f} s as the CLI imports (GC paused, then frozen)")  # fmt: skip
    cores = os.cpu_count() or 1
    cpu, started = _median(base, "cpu_per_rank"), _median(base, "workers_started")
    measured = _median(base, "first_step")
    ranks = NODES * NPROC
    print(f"floor here: {ranks} ranks x {cpu:.2f} CPU-s / {cores} cores = "
          f"{ranks * cpu / cores:.2f} s after the new workers start ({started:.2f} s after the kill)")  # fmt: skip
    print(f"with a core per rank (a GPU node): {started:.2f} + {cpu:.2f} = {started + cpu:.2f} s "
          f"at this load, before CUDA/NCCL set-up (not measured here)")  # fmt: skip
    verdict = "met" if measured <= 5.0 else "missed on this machine (CPU-bound, see the floor)"
    print(f"target kill -> first step <= 5 s: {measured:.2f} s, {verdict}")
    print(f"machine: {machine()}")


def machine() -> str:
    import torch

    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, torch "
            f"{torch.__version__}, python {platform.python_version()}, {stamp}, load {load}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--before",
        type=Path,
        help="bin folder of another installation (e.g. the main branch's .venv/bin): "
        "a variant 'before' run with its torchrun and stormwatch, interleaved",
    )
    parser.add_argument(
        "--monitor",
        type=float,
        action="append",
        default=[],
        help="add a variant with this torchrun --monitor-interval (seconds; repeatable)",
    )
    args = parser.parse_args()
    reps = 1 if args.quick else args.reps
    variants = VARIANTS + ((Variant("before", bin=args.before),) if args.before else ())
    variants += tuple(Variant(f"monitor {m:g} s", monitor_interval=m) for m in args.monitor)
    results: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="stormwatch-recovery-") as tmp:
        for rep in range(reps):
            order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
            for variant in order:
                result = trial(variant, Path(tmp) / f"{variant.name}-{rep}")
                results[variant.name].append(result)
                print(f"rep {rep} {variant.name}: kill -> first step {result['first_step']:.2f} s",
                      flush=True)  # fmt: skip
    imports = import_cost(1 if args.quick else reps)
    report(results, imports, reps)
    if args.json:
        args.json.write_text(json.dumps({"trials": results, "imports": imports}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
