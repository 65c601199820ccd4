#!/usr/bin/env python3
"""What zero-code mode (``stormwatch run -- <cmd>``) costs a job, measured side by side.

Measured in one run, variants interleaved round by round so that the machine's load
affects both alike:

* step time of a plain DDP job (gloo, CPU, 2 ranks under torchrun; the model of
  examples/plain_ddp/train.py, no stormwatch in it), bare and under ``stormwatch run``
  (collective counting, progress heartbeat, flight recorder, dump-request watcher): the
  median of ``--steps`` steps after ``--warmup`` steps, per round;
* start-up of a Python process under the bootstrap ``sitecustomize``: one that is not a
  rank (every tool the job starts pays this), and a rank's main process (``import
  stormwatch.telemetry`` and ``init``; no torch), against a bare ``python -c pass``.

Usage::

    .venv/bin/python benchmarks/zerocode_bench.py [--rounds 3] [--steps 300] [--json out.json]

Takes about a minute and a half on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from stormwatch.telemetry.zerocode import BOOTSTRAP_DIR

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

#: The example's model and step, timed; rank 0 prints its step times (ms) as JSON: wall
#: time, and CPU time of the process (all its threads: what instrumentation adds, less
#: sensitive than wall time to a loaded machine).
STEPS = textwrap.dedent(
    """
    import json, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    warmup, steps = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(dist.get_rank())
    times, cpu = [], []
    for i in range(warmup + steps):
        started, used = time.perf_counter(), time.process_time()
        x = torch.randn(32, 32, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), 0.1 * x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i >= warmup:
            times.append((time.perf_counter() - started) * 1e3)
            cpu.append((time.process_time() - used) * 1e3)
    if dist.get_rank() == 0:
        print("STEPS " + json.dumps({"wall": times, "cpu": cpu}), flush=True)
    dist.destroy_process_group()
    """
)


def _env() -> dict[str, str]:
    drop = ("STORMWATCH_", "TORCH_FR_", "PROMETHEUS_", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.pop("PYTHONPATH", None)
    return env


def step_times(zero_code: bool, warmup: int, steps: int, work: Path) -> dict[str, list[float]]:
    """Step times (ms) of rank 0 of one run: ``wall`` and ``cpu``."""
    script = work / "steps.py"
    script.write_text(STEPS)
    command = [*TORCHRUN, str(script), str(warmup), str(steps)]
    if zero_code:
        command = [STORMWATCH, "run", "--metrics-dir", str(work / "metrics"), "--", *command]
    done = subprocess.run(
        command, env=_env(), capture_output=True, text=True, timeout=600, check=True
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("STEPS "))
    return dict(json.loads(line.removeprefix("STEPS ")))


def startup_ms(extra: dict[str, str], runs: int) -> float:
    """Median wall time (ms) of ``python -c pass`` with ``extra`` in its environment."""
    env = {**_env(), **extra}
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="bare/zero-code pairs")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps first")
    parser.add_argument("--startup-runs", type=int, default=15, help="python starts per case")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zerocode-bench-") as tmp:
        work = Path(tmp)
        runs: dict[str, dict[str, list[float]]] = {
            "bare": {"wall": [], "cpu": []},
            "zero_code": {"wall": [], "cpu": []},
        }
        for _ in range(args.rounds):
            for name in runs:
                times = step_times(name == "zero_code", args.warmup, args.steps, work)
                for kind, values in times.items():
                    runs[name][kind].append(statistics.median(values))
        boot = {"PYTHONPATH": str(BOOTSTRAP_DIR)}
        rank = {
            **boot,
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "TORCHELASTIC_RUN_ID": "bench",
            "STORMWATCH_METRICS_DIR": str(work / "metrics"),
            "STORMWATCH_DUMP_DIR": str(work / "dumps"),
        }
        starts = {
            name: startup_ms(extra, args.startup_runs)
            for name, extra in (("bare", {}), ("not_a_rank", boot), ("rank", rank))
        }
    ratios = {
        kind: statistics.median(runs["zero_code"][kind]) / statistics.median(runs["bare"][kind])
        for kind in ("wall", "cpu")
    }
    result = {"step_ms": runs, "ratio": ratios, "startup_ms": starts, "load": os.getloadavg()}
    print(f"step time of rank 0, median of {args.steps} steps per run (ms), rounds interleaved:")
    for kind in ("wall", "cpu"):
        for name, label in (("bare", "bare     "), ("zero_code", "zero-code")):
            print(f"  {kind:4} {label} {', '.join(f'{t:.3f}' for t in runs[name][kind])}")
        print(f"  {kind:4} ratio of the medians: {ratios[kind]:.3f}")
    print("python start-up, median (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in starts.items()))
    print(f"load average: {', '.join(f'{x:.1f}' for x in result['load'])}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
