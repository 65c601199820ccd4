#!/usr/bin/env python3
"""Where the telemetry API's cost lies on the training thread: one process, gloo at world
size 1, a stand-in step (a few small tensor ops and ``collectives`` all-reduces of 64
bytes, as many as the reference trainer's step issues) with and without a full session
(metrics in prometheus-client multiprocess files, the event log, span files, collective
counting, a step mark with every optional value), interleaved.

Measured: the training thread's CPU time per step (``time.thread_time``: the
background flusher and writers are other threads), bare and instrumented, median of
``rounds`` interleaved blocks; then one cProfile of ``steps`` instrumented steps on the
training thread, summarised by where the time goes (own time per function, grouped
into: collective counting, prometheus-client, event log, spans, the session's step
mark, other). ``--json`` writes the figures for the other benchmarks, which run this
script in a child process (``init()`` and the collective kernels are process-wide).

Usage::

    .venv/bin/python benchmarks/hotpath_profile.py [--steps 200] [--collectives 21] [--json F]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: (group, path fragment of a function's file): the first that matches names its group.
GROUPS = (
    ("collective counting", ("telemetry/comms.py", "telemetry/collective_ops.py")),
    ("prometheus-client", ("prometheus_client",)),
    ("event log", ("telemetry/events.py", "pydantic", "json/")),
    ("spans (OpenTelemetry)", ("opentelemetry", "telemetry/tracing.py", "lifecycle/spans.py")),
    ("metrics batching", ("telemetry/batching.py",)),
    ("step mark (session, checks)", ("telemetry/lifecycle", "telemetry/rank.py")),
    ("metrics wrapper", ("telemetry/metrics.py",)),
    ("torch / gloo (the step itself)", ("torch",)),
)


def _group(filename: str) -> str:
    for name, fragments in GROUPS:
        if any(fragment in filename for fragment in fragments):
            return name
    if filename == "~":
        return "builtins (C calls)"
    return "other"


def run(steps: int, collectives: int, rounds: int) -> dict[str, Any]:
    """Bare and instrumented training-thread CPU per step, and the profile by group."""
    import torch
    import torch.distributed as dist

    import stormwatch.telemetry as swt
    from stormwatch.telemetry.collective_ops import KERNELS
    from stormwatch.trainer.instrument import memory_bytes

    tmp = Path(tempfile.mkdtemp(prefix="stormwatch-hotpath-"))
    os.environ.update(
        {
            "STORMWATCH_METRICS_DIR": str(tmp / "metrics"),
            "STORMWATCH_LOG_DIR": str(tmp / "logs"),
            "STORMWATCH_JOB": "hotpath",
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
        }
    )
    session = swt.init(collectives=False, flight_recorder=False, handle_signals=False)
    session.trace(spans_dir=tmp / "spans")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    weights = torch.randn(64, 64)
    tensor = torch.ones(16)

    def work() -> None:
        for _ in range(4):
            weights.mul_(0.999).add_(0.001)
        for _ in range(collectives):
            dist.all_reduce(tensor)

    step_no = 0
    counter = session.collective_counter()

    def instrumented(n: int) -> None:
        """As the reference trainer's loop: spans, the counter around the step, a step
        record with its own time, wait, MFU and memory (trainer/steps.py)."""
        nonlocal step_no
        for _ in range(n):
            step_no += 1
            started = time.perf_counter()
            with session.span("step", step=step_no):
                with counter, session.span("forward"):
                    work()
                seconds = time.perf_counter() - started
                session.record_step(
                    swt.StepRecord(
                        step=step_no,
                        seconds=seconds,
                        loss=1.0,
                        tokens=1024,
                        grad_norm=1.0,
                        wait_seconds=min(counter.take_wait_seconds(), seconds),
                        mfu=0.3,
                        peak_flops=1e12,
                        memory=memory_bytes("cpu"),
                    )
                )

    def bare(n: int) -> None:
        for _ in range(n):
            work()

    def timed(fn: Any, n: int) -> float:
        started = time.thread_time()
        fn(n)
        return (time.thread_time() - started) / n

    session.start()
    instrumented(steps)  # warm: kernels installed, files open
    KERNELS.uninstall()
    bare(steps)
    bare_times: list[float] = []
    inst_times: list[float] = []
    for _ in range(rounds):
        KERNELS.uninstall()  # installed again when the counter is next entered
        bare_times.append(timed(bare, steps))
        inst_times.append(timed(instrumented, steps))
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    instrumented(steps)
    profiler.disable()
    session.shutdown()
    dist.destroy_process_group()
    by_group: dict[str, float] = {}
    top: list[tuple[float, str]] = []
    for (filename, line, name), row in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        own = row[2]
        group = _group(filename)
        by_group[group] = by_group.get(group, 0.0) + own
        if group not in ("torch / gloo (the step itself)",):
            top.append((own, f"{Path(filename).name}:{line}({name})"))
    top.sort(reverse=True)
    bare_s = statistics.median(bare_times)
    inst_s = statistics.median(inst_times)
    return {
        "steps": steps,
        "collectives_per_step": collectives,
        "bare_seconds": bare_s,
        "instrumented_seconds": inst_s,
        "overhead_seconds": inst_s - bare_s,
        "profile_seconds_per_step": {k: v / steps for k, v in by_group.items()},
        "top_functions_per_step": [(name, own / steps) for own, name in top[:12]],
    }


def summary(figures: dict[str, Any]) -> str:
    """The figures as printed lines (µs per step on the training thread)."""
    lines = [
        f"training thread, one process (gloo, world size 1), "
        f"{figures['collectives_per_step']} collectives per step: bare "
        f"{figures['bare_seconds'] * 1e6:.0f} us, instrumented "
        f"{figures['instrumented_seconds'] * 1e6:.0f} us, telemetry "
        f"{figures['overhead_seconds'] * 1e6:.0f} us per step",
        "  profile of the instrumented step on the training thread (own time, us per step):",
    ]
    groups = sorted(figures["profile_seconds_per_step"].items(), key=lambda kv: -kv[1])
    for name, seconds in groups:
        lines.append(f"    {seconds * 1e6:8.1f}  {name}")
    lines.append("  top telemetry functions (own time, us per step):")
    for name, seconds in figures["top_functions_per_step"]:
        lines.append(f"    {seconds * 1e6:8.1f}  {name}")
    return "\n".join(lines)


def in_child(steps: int = 200, collectives: int = 21, rounds: int = 7) -> dict[str, Any]:
    """:func:`run` in a fresh interpreter (process-wide state stays out of the caller)."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="stormwatch-hotpath-json-") as tmp:
        out = Path(tmp) / "figures.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "RANK"))}
        env["OMP_NUM_THREADS"] = "1"
        command = [sys.executable, str(Path(__file__).resolve()), "--json", str(out)]
        command += ["--steps", str(steps), "--collectives", str(collectives)]
        command += ["--rounds", str(rounds), "--quiet"]
        subprocess.run(command, env=env, check=True, timeout=600)
        figures: dict[str, Any] = json.loads(out.read_text())
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--collectives", type=int, default=21)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    figures = run(args.steps, args.collectives, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(figures))
    if not args.quiet:
        print(summary(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
