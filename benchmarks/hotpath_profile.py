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
    (
        "spans (OpenTelemetry)",
        ("opentelemetry", "otel/timed.py", "telemetry/tracing.py", "lifecycle/spans.py"),
    ),
    (
        "metrics batching (in memory)",
        (
            "telemetry/handoff/metric_writes.py",
            "telemetry/handoff/flusher.py",
            "telemetry/handoff/tally.py",
        ),
    ),
    ("step mark (session, checks)", ("telemetry/lifecycle", "telemetry/rank.py")),
    ("metrics wrapper", ("telemetry/metrics.py",)),
    ("torch / gloo (the step itself)", ("torch",)),
)


#: The group of the step itself (not telemetry): left out of the telemetry's shares.
STEP_ITSELF = "torch / gloo (the step itself)"


def _group(filename: str, function: str) -> str:
    for name, fragments in GROUPS:
        if any(fragment in filename for fragment in fragments):
            return name
    if filename == "~":
        if "torch" in function or "TensorBase" in function:
            return STEP_ITSELF
        return "C calls of the telemetry (locks, clocks, isinstance)"
    if any(part in filename for part in ("stormwatch", "/telemetry/", "/trainer/")):
        return "other"
    return "other libraries (typing, dataclasses, ...)"


def run(steps: int, collectives: int, rounds: int, style: str = "trainer") -> dict[str, Any]:
    """Bare and instrumented training-thread CPU per step, and the profile by group.

    ``style``: ``trainer`` (the reference trainer's calls: spans, its counter entered
    around the step, ``record_step``) or ``api`` (the two-line API as
    ``StormwatchCallback`` uses it: every collective counted, ``step()`` with loss,
    samples, learning rate and gradient norm).
    """
    import torch
    import torch.distributed as dist

    import stormwatch.telemetry as swt
    from stormwatch.telemetry.collective_ops import KERNELS

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
    api = style == "api"
    session = swt.init(collectives=api, flight_recorder=False, handle_signals=False)
    if not api:
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
                        sample_rss=True,  # as trainer/steps.py on the CPU
                    )
                )

    def through_the_api(n: int) -> None:
        nonlocal step_no
        for _ in range(n):
            step_no += 1
            work()
            session.step(step_no, loss=1.0, samples=64, lr=1e-3, grad_norm=1.0)

    def bare(n: int) -> None:
        for _ in range(n):
            work()

    def timed(fn: Any, n: int) -> float:
        started = time.thread_time()
        fn(n)
        return (time.thread_time() - started) / n

    measured = through_the_api if api else instrumented
    collectives_of = session._collectives

    def counting(on: bool) -> None:
        if not api:
            return
        if on:
            collectives_of.always()
        else:
            collectives_of.stop()

    session.start()
    counting(True)
    measured(steps)  # warm: kernels installed, files open
    bare_times: list[float] = []
    kernel_times: list[float] = []
    inst_times: list[float] = []
    for _ in range(rounds):
        counting(False)
        KERNELS.uninstall()  # installed again when the counter is next entered
        bare_times.append(timed(bare, steps))
        # The kernels installed, nobody observing: each collective is boxed into the Python
        # kernel and handed straight back. The floor of counting collectives from Python.
        KERNELS.install()
        kernel_times.append(timed(bare, steps))
        counting(True)
        inst_times.append(timed(measured, steps))
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    measured(steps)
    profiler.disable()
    session.shutdown()
    dist.destroy_process_group()
    by_group: dict[str, float] = {}
    top: list[tuple[float, str]] = []
    for (filename, line, name), row in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        own = row[2]
        group = _group(filename, name)
        by_group[group] = by_group.get(group, 0.0) + own
        if group != STEP_ITSELF and "hotpath_profile" not in filename:
            top.append((own, f"{Path(filename).name}:{line}({name})"))
    top.sort(reverse=True)
    bare_s = statistics.median(bare_times)
    inst_s = statistics.median(inst_times)
    # cProfile's own cost per call inflates the many small telemetry calls: the shares of
    # the profiled telemetry time are kept, scaled to the overhead measured without it
    profiled = sum(v for k, v in by_group.items() if k != STEP_ITSELF) or 1.0
    overhead = max(inst_s - bare_s, 0.0)
    return {
        "style": style,
        "steps": steps,
        "collectives_per_step": collectives,
        "bare_seconds": bare_s,
        "instrumented_seconds": inst_s,
        "overhead_seconds": inst_s - bare_s,
        "kernels_seconds": statistics.median(kernel_times) - bare_s,
        "profile_share": {k: v / profiled for k, v in by_group.items() if k != STEP_ITSELF},
        "top_functions_share": [(name, own / profiled) for own, name in top[:10]],
        "overhead_per_step": overhead,
    }


def summary(figures: dict[str, Any]) -> str:
    """The figures as printed lines (µs per step on the training thread)."""
    calls = "the reference trainer's" if figures["style"] == "trainer" else "the API's step()"
    lines = [
        f"training thread, one process (gloo, world size 1), {calls} calls, "
        f"{figures['collectives_per_step']} collectives per step: bare "
        f"{figures['bare_seconds'] * 1e6:.0f} us, instrumented "
        f"{figures['instrumented_seconds'] * 1e6:.0f} us, telemetry "
        f"{figures['overhead_seconds'] * 1e6:.0f} us per step",
        f"  of which the collectives' Python kernels alone (installed, counting nothing: torch "
        f"boxes each call into Python and back, the floor of counting collectives from "
        f"Python): {figures['kernels_seconds'] * 1e6:.0f} us per step, "
        f"{figures['kernels_seconds'] / figures['collectives_per_step'] * 1e6:.1f} us per "
        "collective",
        "  where it goes (cProfile of the training thread, own time: share of the telemetry's,",
        "  and that share of the measured cost in us per step):",
    ]
    overhead = figures["overhead_per_step"] * 1e6
    groups = sorted(figures["profile_share"].items(), key=lambda kv: -kv[1])
    for name, share in groups:
        lines.append(f"    {share * 100:5.1f} %  {share * overhead:7.1f} us  {name}")
    lines.append("  top functions (share of the telemetry's time):")
    for name, share in figures["top_functions_share"]:
        lines.append(f"    {share * 100:5.1f} %  {name}")
    return "\n".join(lines)


def in_child(
    steps: int = 200, collectives: int = 21, rounds: int = 7, style: str = "trainer"
) -> dict[str, Any]:
    """:func:`run` in a fresh interpreter (process-wide state stays out of the caller)."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="stormwatch-hotpath-json-") as tmp:
        out = Path(tmp) / "figures.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "RANK"))}
        env["OMP_NUM_THREADS"] = "1"
        command = [sys.executable, str(Path(__file__).resolve()), "--json", str(out)]
        command += ["--steps", str(steps), "--collectives", str(collectives)]
        command += ["--rounds", str(rounds), "--style", style, "--quiet"]
        subprocess.run(command, env=env, check=True, timeout=600)
        figures: dict[str, Any] = json.loads(out.read_text())
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--collectives", type=int, default=21)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--style", choices=("trainer", "api"), default="trainer")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    figures = run(args.steps, args.collectives, args.rounds, args.style)
    if args.json:
        args.json.write_text(json.dumps(figures))
    if not args.quiet:
        print(summary(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
