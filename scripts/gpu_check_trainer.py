#!/usr/bin/env python3
"""GPU check of the trainer: NCCL at world size 1, seen by the agent's NVML collection.

On a machine with an NVIDIA GPU (a driver NVML can load) and a CUDA build of torch:

1. starts ``stormwatch agent run --gpu-backend nvml`` on 127.0.0.1 (the same
   agent start-up as ``scripts/gpu_check.py``), reading the run's metrics folder;
2. runs ``torchrun --standalone --nproc-per-node 1 stormwatch -v train`` for
   ``--steps`` steps of a model large enough to keep the GPU busy for a few
   agent samples (world size 1: NCCL does not allow two ranks on one GPU);
3. scrapes the agent every half second while the trainer runs.

It FAILS (exit 1) unless: the trainer exits 0; its process group used NCCL
(``backend cuda:nccl,...`` in its log); it allocated CUDA memory
(``stormwatch_train_memory_bytes{kind="cuda_max_allocated"}``); the agent
reported every GPU up (``stormwatch_gpu_up 1``) from real NVML; and the trainer
exported an MFU through the agent. It prints the GPU model, the median step
time (from the trainer's event log, first ``--warmup`` steps left out),
tokens/s, MFU against the peak the trainer used (``PEAK_FLOPS_BY_DEVICE`` in
``telemetry/perf.py``, or ``--peak-flops``), and what NVML saw during the run:
peak framebuffer use and utilisation, and the GPU memory the agent attributed to
rank 0 (``stormwatch_rank_gpu_memory_used_bytes``; informational, since inside a
container NVML may report host PIDs that cannot be attributed).

Without a usable GPU it prints ``skipped: no NVIDIA GPU (<reason>)`` and exits 0
(the reason: NVML cannot be loaded or initialised, NVML sees no GPU, torch is a
CPU-only build, or torch cannot use the GPU). ``--sim`` runs the same flow
against the simulated GPU backend with the trainer on CPU (gloo), to test this
script on a machine without a GPU; the NCCL and CUDA-memory checks are then off.

Usage: ``.venv/bin/python scripts/gpu_check_trainer.py [--steps 60] [--sim]
[--peak-flops F] [--json FILE]`` (under a minute on a GPU; needs the stormwatch
package installed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any

# Same folder: the agent start-up, exposition parsing and HTTP GET of the agent's check.
from gpu_check import get, parse, start_agent, stop_agent

#: Model of the GPU run: ~100 M parameters, 8k tokens per step (a few GFLOP per
#: token-batch pass; tens of milliseconds per step on a recent GPU).
GPU_MODEL_ARGS = (
    "--d-model", "1024", "--n-heads", "16", "--n-layers", "8",
    "--seq-len", "512", "--micro-batch", "16", "--dropout", "0",
)  # fmt: skip
GPU_TOKENS_PER_STEP = 512 * 16  # --seq-len x --micro-batch
#: --sim: the default tiny model on CPU, slowed so the agent sees a few samples.
SIM_MODEL_ARGS = ("--step-delay", "0.2")
SIM_TOKENS_PER_STEP = 64 * 4  # the CLI's defaults
TRAIN_TIMEOUT_SECONDS = 300


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the check, or None when it can."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError ...
        return f"NVML cannot be initialised: {type(exc).__name__}: {exc}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    if count < 1:
        return "NVML sees no GPU"
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build; install a CUDA build of torch"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} cannot use the GPU (torch.cuda.is_available() is False)"
    return None


def stormwatch_command() -> list[str]:
    script = Path(sys.executable).with_name("stormwatch")
    if script.exists():
        return [str(script)]
    found = shutil.which("stormwatch")
    return [found] if found else [sys.executable, "-m", "stormwatch.cli"]


def start_trainer(work: Path, *, steps: int, sim: bool, peak_flops: float | None) -> Any:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        "--no-python", *stormwatch_command(), "-v", "train", "--steps", str(steps),
        "--job", "gpu-check", "--metrics-dir", str(work / "metrics"),
        "--log-dir", str(work / "logs"), "--log-every", "10",
        *(SIM_MODEL_ARGS if sim else GPU_MODEL_ARGS),
    ]  # fmt: skip
    if peak_flops is not None:
        command += ["--peak-flops", str(peak_flops)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    if sim:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, even on a machine with a GPU
    log = (work / "trainer.log").open("wb")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log


def watch(url: str, trainer: Any) -> dict[str, Any]:
    """Scrape the agent until the trainer exits; keep what the check needs."""
    seen: dict[str, Any] = {
        "gpus": {},
        "gpu_up": {},
        "fb_used_mib": [],
        "util_percent": [],
        "rank_gpu_bytes": 0.0,
        "rejected": {},
        "mfu": None,
        "peak_flops": None,
        "cuda_bytes": 0.0,
        "scrapes": 0,
    }
    deadline = time.monotonic() + TRAIN_TIMEOUT_SECONDS
    while True:
        running = trainer.poll() is None
        try:
            families = parse(get(url + "/metrics")[0].decode())
        except (OSError, urllib.error.URLError):
            families = {}
        if families:
            seen["scrapes"] += 1
            for labels, value in families.get("stormwatch_gpu_up", []):
                seen["gpu_up"][labels["gpu"]] = value
            for labels, _ in families.get("stormwatch_gpu_info", []):
                seen["gpus"][labels["gpu"]] = labels.get("model_name", "?")
            for name, key in (
                ("DCGM_FI_DEV_FB_USED", "fb_used_mib"),
                ("DCGM_FI_DEV_GPU_UTIL", "util_percent"),
            ):
                seen[key] += [value for _, value in families.get(name, [])]
            for labels, value in families.get("stormwatch_rank_gpu_memory_used_bytes", []):
                if labels.get("training_job") == "gpu-check":
                    seen["rank_gpu_bytes"] = max(seen["rank_gpu_bytes"], value)
            for labels, value in families.get("stormwatch_gpu_processes_rejected", []):
                if value:
                    seen["rejected"][labels.get("reason", "?")] = value
            for labels, value in families.get("stormwatch_train_mfu_ratio", []):
                if labels.get("training_job") == "gpu-check":
                    seen["mfu"] = value
            for labels, value in families.get("stormwatch_train_peak_flops_per_second", []):
                if labels.get("training_job") == "gpu-check":
                    seen["peak_flops"] = value
            for labels, value in families.get("stormwatch_train_memory_bytes", []):
                if (
                    labels.get("training_job") == "gpu-check"
                    and labels.get("kind") == "cuda_max_allocated"
                ):
                    seen["cuda_bytes"] = max(seen["cuda_bytes"], value)
        if not running:
            return seen
        if time.monotonic() > deadline:
            trainer.kill()
            trainer.wait()
            return seen
        time.sleep(0.5)


def step_times(work: Path, warmup: int) -> list[float]:
    from stormwatch.telemetry.events import StepEvent, log_path, read_events

    path = log_path(work / "logs", 0)
    if not path.exists():
        return []
    return [
        e.step_seconds
        for e in read_events(path)
        if isinstance(e, StepEvent)
        and e.step is not None
        and e.step > warmup
        and e.step_seconds is not None
    ]


def evaluate(
    work: Path, seen: dict[str, Any], code: int, *, sim: bool, warmup: int
) -> dict[str, Any]:
    log = (work / "trainer.log").read_text(errors="replace")
    failures: list[str] = []
    if code != 0:
        failures.append(f"the trainer exited {code}; its log ends:\n{log[-3000:]}")
    backend = next(
        (
            line.split("backend ", 1)[1].split(",")[0]
            for line in log.splitlines()
            if "process group: rank" in line and "backend " in line
        ),
        None,
    )
    if not sim and backend != "cuda:nccl":
        failures.append(
            f"the trainer's process group used {backend or 'an unknown backend'}, not NCCL"
        )
    if not sim and seen["cuda_bytes"] <= 0:
        failures.append(
            "the trainer reported no CUDA memory (stormwatch_train_memory_bytes kind=cuda_max_allocated)"
        )
    if not seen["gpu_up"]:
        failures.append(
            "the agent exported no stormwatch_gpu_up series (NVML collection saw no GPU)"
        )
    for gpu, up in sorted(seen["gpu_up"].items()):
        if up != 1:
            failures.append(f"the agent reports GPU {gpu} down (stormwatch_gpu_up 0)")
    if seen["mfu"] is None or not seen["mfu"] > 0:
        failures.append("no MFU exported through the agent (stormwatch_train_mfu_ratio)")
    times = step_times(work, warmup)
    if not times and code == 0:
        failures.append("no step in the trainer's event log after the warm-up steps")
    return {
        "backend": backend,
        "gpus": seen["gpus"],
        "step_seconds_median": statistics.median(times) if times else None,
        "steps_measured": len(times),
        "failures": failures,
        **{
            k: seen[k]
            for k in ("mfu", "peak_flops", "cuda_bytes", "rank_gpu_bytes", "rejected", "scrapes")
        },
        "fb_used_mib_peak": max(seen["fb_used_mib"], default=None),
        "util_percent_peak": max(seen["util_percent"], default=None),
    }


def report(result: dict[str, Any], tokens_per_step: int, *, sim: bool) -> None:
    print(f"GPUs seen by the agent ({result['scrapes']} scrapes): {result['gpus'] or 'none'}")
    print(f"trainer: world size 1, backend {result['backend']}")
    median = result["step_seconds_median"]
    if median:
        print(
            f"step time: median {median * 1000:.1f} ms over {result['steps_measured']} steps, "
            f"{tokens_per_step / median:,.0f} tokens/s"
        )
    if result["mfu"] is not None:
        peak = result["peak_flops"]
        peak_text = (
            "?"
            if not peak
            else f"{peak / 1e12:.1f} TFLOP/s"
            if peak >= 1e12
            else f"{peak / 1e9:.0f} GFLOP/s"
        )
        print(f"MFU: {result['mfu'] * 100:.2f} % of a peak of {peak_text} (last step seen)")
    print(f"CUDA memory (max allocated): {result['cuda_bytes'] / 2**20:.0f} MiB")
    fb, util = result["fb_used_mib_peak"], result["util_percent_peak"]
    print(
        "NVML during the run: framebuffer used peak "
        f"{'?' if fb is None else f'{fb:.0f}'} MiB, utilisation peak "
        f"{'?' if util is None else f'{util:.0f}'} %"
    )
    if result["rank_gpu_bytes"] > 0:
        print(
            f"agent attributed {result['rank_gpu_bytes'] / 2**20:.0f} MiB of GPU memory to rank 0"
        )
    else:
        reasons = ", ".join(f"{k}={v:.0f}" for k, v in result["rejected"].items()) or "none listed"
        print(f"note: no GPU memory attributed to rank 0 (rejected entries: {reasons})")
    if result["failures"]:
        print(f"FAILED ({len(result['failures'])}):")
        for failure in result["failures"]:
            print(f"  - {failure}")
    elif sim:
        print("OK (--sim: simulated GPUs, trainer on CPU with gloo; NCCL and CUDA not checked)")
    else:
        print("OK: the trainer ran on the GPU with NCCL and the agent's NVML collection saw it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the step time")
    parser.add_argument("--peak-flops", type=float, help="peak FLOP/s of the GPU for MFU")
    parser.add_argument("--sim", action="store_true", help="simulated GPUs, trainer on CPU")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error(f"--steps must be above --warmup ({args.warmup})")
    if not args.sim:
        reason = no_gpu_reason()
        if reason is not None:
            print(f"skipped: no NVIDIA GPU ({reason})")
            return 0
    tokens_per_step = SIM_TOKENS_PER_STEP if args.sim else GPU_TOKENS_PER_STEP
    with tempfile.TemporaryDirectory(prefix="stormwatch-gpu-check-trainer-") as tmp:
        work = Path(tmp)
        agent, url, agent_log = start_agent(work, args.sim)
        try:
            trainer, sink = start_trainer(
                work, steps=args.steps, sim=args.sim, peak_flops=args.peak_flops
            )
            with sink:
                seen = watch(url, trainer)
            code = trainer.wait()
        finally:
            stop_agent(agent)
        result = evaluate(work, seen, code, sim=args.sim, warmup=args.warmup)
        if agent.returncode != 0:
            result["failures"].append(
                f"agent exited {agent.returncode}: {agent_log.read_text()[-2000:]}"
            )
    report(result, tokens_per_step, sim=args.sim)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
