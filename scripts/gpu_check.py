#!/usr/bin/env python3
"""GPU check: the node agent against the real NVML, every catalogue GPU metric accounted for.

On a machine with an NVIDIA driver: starts ``stormwatch agent run --gpu-backend
nvml`` on 127.0.0.1 for a few seconds (GPM profiling needs two samples), then
checks every GPU metric of ``agent/catalogue.csv``:

* each ``DCGM_*`` metric is exported for every GPU, or that GPU marks it
  ``stormwatch_metric_supported{gpu,metric} 0`` (the reason comes from
  ``/healthz``) -- anything else FAILS (exit 1);
* the agent's own GPU metrics (``stormwatch_gpu_*``, ``stormwatch_nvlink_*``) are
  reported present, or absent with why that is expected (no NVLink, no XID yet, no
  ranks running), so a reader can judge them;
* every GPU is up and every collector healthy; the sample time and the scrape
  latency are printed (the agent's cost on real hardware).

Without a driver it prints ``skipped: no NVIDIA driver`` and exits 0.
``--sim`` runs the same checks against the simulated backend (to test this
script on a machine without a GPU).

Usage: ``.venv/bin/python scripts/gpu_check.py [--seconds 5] [--sim] [--json FILE]``
(well under a minute; needs the stormwatch package installed, no torch import).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

#: Families whose absence is expected in a short run, and why.
EXPECTED_ABSENT = {
    "stormwatch_gpu_xid_errors_total": "no XID event during the check (good)",
    "stormwatch_gpu_nvml_errors_total": "no NVML call failed (good)",
    "stormwatch_metric_supported": "every DCGM metric is supported on every GPU",
    "stormwatch_rank_gpu_memory_used_bytes": "needs training ranks on the GPUs",
    "stormwatch_gpu_processes_rejected": "needs processes on the GPUs",
    "DCGM_EXP_XID_ERRORS_COUNT": "no XID in the window (DCGM_FI_DEV_XID_ERRORS is exported)",
}
NVLINK_FAMILIES = ("stormwatch_nvlink_", "DCGM_FI_DEV_NVLINK_", "DCGM_EXP_P2P_STATUS")


def nvidia_driver() -> str | None:
    """The driver version, or None when NVML cannot be initialised."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... : no usable GPU
        return None
    try:
        return str(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Exposition text -> {family name (as exposed): [(labels, value)]}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        out[name] = [(dict(s.labels), s.value) for s in family.samples]
    return out


def get(url: str) -> tuple[bytes, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as reply:
        body = reply.read()
    return body, time.perf_counter() - started


def start_agent(work: Path, sim: bool) -> tuple[subprocess.Popen[bytes], str, Path]:
    script = Path(sys.executable).with_name("stormwatch")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "stormwatch.cli"]
    log = work / "agent.log"
    args = [
        *command,
        "agent",
        "run",
        "--listen",
        "127.0.0.1:0",
        "--node",
        "gpu-check",
        "--metrics-dir",
        str(work / "metrics"),
        "--state-dir",
        str(work / "state"),
        "--gpu-backend",
        "sim" if sim else "nvml",
        "--sample-interval",
        "1",
    ]
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    with log.open("wb") as sink:
        proc = subprocess.Popen(args, stdout=sink, stderr=sink, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"agent exited {proc.returncode}:\n{log.read_text()}")
        for line in log.read_text().splitlines():
            if "listening on " in line:
                return proc, line.split("listening on ", 1)[1].split()[0], log
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"agent did not start within 60 s:\n{log.read_text()}")


def stop_agent(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the agent (it reverts its faults and exits); SIGKILL after 30 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def check(url: str, seconds: float) -> dict[str, Any]:
    from stormwatch.agent.catalogue import load_catalogue

    time.sleep(seconds)
    latencies = []
    for _ in range(5):
        body, elapsed = get(url + "/metrics")
        latencies.append(elapsed)
    families = parse(body.decode())
    health = json.loads(get(url + "/healthz")[0])
    gpus = sorted(labels["gpu"] for labels, _ in families.get("stormwatch_gpu_up", []))
    up = {labels["gpu"]: value for labels, value in families.get("stormwatch_gpu_up", [])}
    unsupported = {
        (labels["gpu"], labels["metric"])
        for labels, value in families.get("stormwatch_metric_supported", [])
        if value == 0
    }
    no_nvlink = {
        labels["gpu"]
        for labels, value in families.get("stormwatch_nvlink_supported", [])
        if labels.get("link") == "all" and value == 0
    }
    rows: list[dict[str, str]] = []
    failures: list[str] = []
    for spec in load_catalogue():
        if spec.source not in ("gpu", "nvlink", "xid", "gpu_processes"):
            continue
        series = families.get(spec.name, [])
        if spec.name.startswith("DCGM_") and "gpu" in spec.labels:
            for gpu in gpus:
                if any(labels.get("gpu") == gpu for labels, _ in series):
                    rows.append({"metric": spec.name, "gpu": gpu, "status": "present"})
                elif (gpu, spec.name) in unsupported:
                    why = health.get("unsupported_metrics", {}).get(gpu, {}).get(spec.name, "?")
                    rows.append({"metric": spec.name, "gpu": gpu, "status": f"unsupported: {why}"})
                elif spec.name in EXPECTED_ABSENT:
                    rows.append({"metric": spec.name, "gpu": gpu, "status": "absent (expected)"})
                elif spec.name == "DCGM_EXP_P2P_STATUS" and len(gpus) < 2:
                    rows.append({"metric": spec.name, "gpu": gpu, "status": "absent: one GPU"})
                else:
                    rows.append({"metric": spec.name, "gpu": gpu, "status": "MISSING"})
                    failures.append(f"{spec.name} on GPU {gpu}: neither exported nor unsupported")
            continue
        if series:
            status = f"present ({len(series)} series)"
        elif spec.name in EXPECTED_ABSENT:
            status = f"absent: {EXPECTED_ABSENT[spec.name]}"
        elif spec.name.startswith(NVLINK_FAMILIES) and no_nvlink == set(gpus):
            status = "absent: no NVLink on any GPU"
        else:
            status = "absent (unexplained)"
            failures.append(f"{spec.name}: absent without an explanation")
        rows.append({"metric": spec.name, "gpu": "*", "status": status})
    for gpu, value in sorted(up.items()):
        if value != 1:
            failures.append(f"GPU {gpu} is down (stormwatch_gpu_up 0)")
    for name, ok in health.get("collectors", {}).items():
        if not ok:
            failures.append(f"collector {name} is down")
    models = {
        labels["gpu"]: labels["model_name"] for labels, _ in families.get("stormwatch_gpu_info", [])
    }
    duration = families.get("stormwatch_gpu_snapshot_duration_seconds", [({}, float("nan"))])[0][1]
    return {
        "gpus": {gpu: models.get(gpu, "?") for gpu in gpus},
        "backend": health.get("gpu_backend"),
        "rows": rows,
        "failures": failures,
        "unsupported": health.get("unsupported_metrics", {}),
        "sample_seconds": duration,
        "scrape_seconds": sorted(latencies)[len(latencies) // 2],
        "exposition_bytes": len(body),
    }


def report(result: dict[str, Any], driver: str) -> None:
    print(f"driver {driver}, backend {result['backend']}, GPUs: {result['gpus']}")
    width = max(len(row["metric"]) for row in result["rows"])
    for row in result["rows"]:
        print(f"  {row['metric']:<{width}}  gpu={row['gpu']:<2} {row['status']}")
    print(
        f"GPU sample {result['sample_seconds'] * 1000:.1f} ms, /metrics median "
        f"{result['scrape_seconds'] * 1000:.1f} ms ({result['exposition_bytes'] / 1024:.0f} KiB)"
    )
    if result["failures"]:
        print(f"FAILED ({len(result['failures'])}):")
        for failure in result["failures"]:
            print(f"  - {failure}")
    else:
        print("OK: every catalogue GPU metric is exported or marked unsupported with a reason")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="sampling before the check")
    parser.add_argument("--sim", action="store_true", help="simulated GPUs (tests this script)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    driver = "simulated" if args.sim else nvidia_driver()
    if driver is None:
        print("skipped: no NVIDIA driver (NVML cannot be initialised)")
        return 0
    with tempfile.TemporaryDirectory(prefix="stormwatch-gpu-check-") as tmp:
        proc, url, log = start_agent(Path(tmp), args.sim)
        try:
            result = check(url, args.seconds)
        finally:
            stop_agent(proc)
        result["agent_exit_code"] = proc.returncode
        if proc.returncode != 0:
            result["failures"].append(f"agent exited {proc.returncode}: {log.read_text()[-2000:]}")
    report(result, driver)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
