#!/usr/bin/env python3
"""Benchmark the node agent against prometheus-node-exporter on this machine.

Setup: one ``stormwatch agent run`` with a simulated 8-GPU node (18 NVLinks
per GPU, 1 s sampling) and 8 "ranks" (live processes) that wrote prometheus-client
multiprocess files: step-time histograms, per-collective-op duration
histograms and counters, and live gauges, like the trainer does.

Measured, side by side in one run:

* scrape latency p50/p99 of ``GET /metrics`` (agent vs node-exporter, scrapes
  interleaved over one keep-alive connection each, like Prometheus);
* the same, and the CPU share of one core, with a scrape every
  ``--paced-interval`` (2 s) for ``--paced-seconds`` (30 s), like Prometheus
  (the agent renders its exposition ahead of the predicted scrape, so this is
  the realistic case);
* CPU share of one core of the agent over ``--cpu-seconds`` (30 s) of 1 s
  sampling with no scrapes (target <= 2 %), plus the CPU cost of one scrape
  (from the latency phase);
* resident memory (RSS, and the peak VmHWM).

Usage::

    .venv/bin/python benchmarks/agent_bench.py [--gpus 8] [--ranks 8] [--scrapes 200]
        [--cpu-seconds 30] [--json results.json] [--no-node-exporter]

node-exporter: the Debian package ``prometheus-node-exporter``. When the binary
is missing and we are root with apt, it is installed (with a message); otherwise
its column is skipped with a note. Everything runs on 127.0.0.1 in a temporary
directory that is removed afterwards. Takes about 2 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

NODE_EXPORTER = "prometheus-node-exporter"

#: One simulated rank: writes the trainer's metric kinds, then stays alive.
RANK_CODE = textwrap.dedent(
    """
    import os, sys, time
    from prometheus_client import Counter, Gauge, Histogram
    rank = sys.argv[1]
    lab = dict(training_job="bench", rank=rank)
    live = dict(multiprocess_mode="livemax")
    ops = ["all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "barrier"]
    step = Gauge("stormwatch_train_step", "s", ["training_job", "rank"], **live)
    beat = Gauge("stormwatch_train_last_step_timestamp_seconds", "b", ["training_job", "rank"], **live)
    loss = Gauge("stormwatch_train_loss", "l", ["training_job", "rank"], **live)
    dur = Histogram("stormwatch_train_step_duration_seconds", "d", ["training_job", "rank"])
    coll = Histogram("stormwatch_collective_op_duration_seconds", "c", ["training_job", "rank", "op"])
    calls = Counter("stormwatch_collective_calls", "c", ["training_job", "rank", "op"])
    nbytes = Counter("stormwatch_collective_bytes", "b", ["training_job", "rank", "op"])
    ctime = Counter("stormwatch_collective_duration_seconds", "t", ["training_job", "rank", "op"])
    for i in range(50):
        step.labels(**lab).set(i)
        beat.labels(**lab).set(time.time())
        loss.labels(**lab).set(2.0 / (i + 1))
        dur.labels(**lab).observe(0.1 + i * 0.001)
        for op in ops:
            coll.labels(op=op, **lab).observe(0.001 * (i % 7 + 1))
            calls.labels(op=op, **lab).inc()
            nbytes.labels(op=op, **lab).inc(1 << 20)
            ctime.labels(op=op, **lab).inc(0.002)
    print("ready", flush=True)
    while True:
        time.sleep(3600)
    """
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(host: str, port: int, path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = http.client.HTTPConnection(host, port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{host}:{port}{path} did not answer within {timeout:.0f} s")
        time.sleep(0.2)


def node_exporter_binary(allow_install: bool) -> tuple[str | None, str]:
    """The node-exporter binary, installing the Debian package if allowed; else (None, why)."""
    found = shutil.which(NODE_EXPORTER)
    if found:
        return found, ""
    if not allow_install:
        return None, f"{NODE_EXPORTER} not installed (--no-install)"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return (
            None,
            f"{NODE_EXPORTER} not installed (needs root + apt: apt-get install {NODE_EXPORTER})",
        )
    print(f">> {NODE_EXPORTER} missing: installing the Debian package with apt-get", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    steps = (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", NODE_EXPORTER],
    )
    for step in steps:
        if subprocess.run(step, env=env, check=False).returncode != 0:
            return None, f"apt-get could not install {NODE_EXPORTER}"
    # The package starts a system service; this benchmark runs its own copy.
    subprocess.run(
        ["systemctl", "disable", "--now", NODE_EXPORTER], check=False, capture_output=True
    )
    found = shutil.which(NODE_EXPORTER)
    return (found, "") if found else (None, f"{NODE_EXPORTER} still missing after apt-get")


class Target:
    """A process serving /metrics on 127.0.0.1, scraped over one keep-alive connection."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], port: int) -> None:
        self.name, self.proc, self.port = name, proc, port
        self.ps = psutil.Process(proc.pid)
        self._conn: http.client.HTTPConnection | None = None
        self.latencies: list[float] = []
        self.cpu_during_scrapes = 0.0
        self.paced_latencies: list[float] = []
        self.paced_cpu = 0.0
        self.bytes = 0
        self.series = 0

    def scrape(self) -> float:
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        started = time.perf_counter()
        self._conn.request("GET", "/metrics", headers={"Accept": "text/plain"})
        reply = self._conn.getresponse()
        body = reply.read()
        elapsed = time.perf_counter() - started
        if reply.status != 200:
            raise SystemExit(f"{self.name}: /metrics answered {reply.status}")
        self.bytes = len(body)
        self.series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        return elapsed

    def cpu_seconds(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def memory(self) -> tuple[int, int]:
        """(RSS, peak RSS) in bytes."""
        rss = self.ps.memory_info().rss
        peak = rss
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
        return rss, peak

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_ranks(count: int, metrics_dir: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    ranks = []
    for rank in range(count):
        proc = subprocess.Popen(
            [sys.executable, "-c", RANK_CODE, str(rank)], env=env, stdout=subprocess.PIPE
        )
        procs.append(proc)
        ranks.append(proc)
    for proc in ranks:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise SystemExit("a simulated rank failed to write its metrics")


def start_agent(args: argparse.Namespace, work: Path, procs: list[Any]) -> Target:
    port = free_port()
    script = Path(sys.executable).with_name("stormwatch")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "stormwatch.cli"]
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    log = (work / "agent.log").open("wb")
    proc = subprocess.Popen(
        [
            *command,
            "agent",
            "run",
            "--listen",
            f"127.0.0.1:{port}",
            "--node",
            "bench",
            "--metrics-dir",
            str(work / "metrics"),
            "--state-dir",
            str(work / "state"),
            "--gpu-backend",
            "sim",
            "--sim-gpus",
            str(args.gpus),
            "--sample-interval",
            "1",
        ],
        stdout=log,
        stderr=log,
        env=env,
    )
    procs.append(proc)
    wait_http("127.0.0.1", port, "/healthz")
    return Target("stormwatch agent", proc, port)


def start_node_exporter(binary: str, work: Path, procs: list[Any]) -> Target:
    port = free_port()
    log = (work / "node-exporter.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log
    )
    procs.append(proc)
    wait_http("127.0.0.1", port, "/metrics")
    return Target("node-exporter", proc, port)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def measure_scrapes(targets: list[Target], count: int) -> None:
    for target in targets:  # warm up: first scrapes compile, fill caches, open connections
        for _ in range(3):
            target.scrape()
    for target in targets:
        target.cpu_during_scrapes = -target.cpu_seconds()
    for _ in range(count):
        for target in targets:  # interleaved: both see the same machine load
            target.latencies.append(target.scrape())
    for target in targets:
        target.cpu_during_scrapes += target.cpu_seconds()


def measure_paced(targets: list[Target], interval: float, seconds: float) -> None:
    """Scrape each target every ``interval`` s for ``seconds`` s, like Prometheus does:
    latencies and the CPU share of one core under that load."""
    for target in targets:
        target.paced_latencies = []
        target.paced_cpu = -target.cpu_seconds()
    started = time.monotonic()
    deadline = started + seconds
    tick = started
    while tick < deadline:
        for target in targets:
            target.paced_latencies.append(target.scrape())
        tick += interval
        time.sleep(max(0.0, tick - time.monotonic()))
    elapsed = time.monotonic() - started
    for target in targets:
        target.paced_cpu = (target.paced_cpu + target.cpu_seconds()) / elapsed


def measure_idle_cpu(target: Target, seconds: float) -> float:
    start_cpu, start = target.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    return (target.cpu_seconds() - start_cpu) / (time.monotonic() - start)


def report(results: dict[str, Any], note: str) -> None:
    from rich.console import Console
    from rich.table import Table

    agent, node = results["agent"], results.get("node_exporter")
    table = Table(title=f"agent vs node-exporter ({results['setup']})")
    table.add_column("measure")
    table.add_column("stormwatch agent", justify="right")
    table.add_column("node-exporter", justify="right")
    table.add_column("agent / node-exporter", justify="right")

    def row(label: str, key: str, fmt: str, scale: float = 1.0) -> None:
        a = agent[key] * scale
        n = node[key] * scale if node else None
        ratio = f"{a / n:.2f}x" if n else "-"
        table.add_row(label, fmt.format(a), fmt.format(n) if n is not None else "-", ratio)

    row("scrape p50 (ms)", "p50_s", "{:.2f}", 1000)
    row("scrape p99 (ms)", "p99_s", "{:.2f}", 1000)
    row("scrape mean (ms)", "mean_s", "{:.2f}", 1000)
    row("exposition size (KiB)", "bytes", "{:.0f}", 1 / 1024)
    row("series", "series", "{:.0f}")
    row("CPU per scrape (ms)", "cpu_per_scrape_s", "{:.2f}", 1000)
    paced = f"{results['paced_interval']:g} s"
    row(f"paced scrape p50 (ms), every {paced}", "paced_p50_s", "{:.2f}", 1000)
    row(f"paced scrape p99 (ms), every {paced}", "paced_p99_s", "{:.2f}", 1000)
    row(f"CPU share, a scrape every {paced} (%)", "paced_cpu_share", "{:.2f}", 100)
    row("RSS (MiB)", "rss_bytes", "{:.1f}", 1 / 2**20)
    row("peak RSS (MiB)", "peak_rss_bytes", "{:.1f}", 1 / 2**20)
    Console().print(table)
    cpu = Table(title="agent CPU, share of one core")
    cpu.add_column("condition")
    cpu.add_column("share", justify="right")
    cpu.add_column("target", justify="right")
    share = agent["cpu_idle_share"]
    cpu.add_row(
        f"1 s sampling, no scrapes ({results['cpu_seconds']:.0f} s)",
        f"{share * 100:.2f} %",
        "<= 2 %" + (" OK" if share <= 0.02 else " MISSED"),
    )
    cpu.add_row(
        f"a scrape every {results['paced_interval']:g} s (measured)",
        f"{agent['paced_cpu_share'] * 100:.2f} %",
        "",
    )
    Console().print(cpu)
    if note:
        print(f"note: {note}")
    print(f"load average during the run: {results['loadavg']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (18 NVLinks each)")
    parser.add_argument("--ranks", type=int, default=8, help="simulated ranks' metric files")
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per target")
    parser.add_argument("--cpu-seconds", type=float, default=30.0, help="idle CPU window")
    parser.add_argument(
        "--paced-interval", type=float, default=2.0, help="scrape interval of the paced phase"
    )
    parser.add_argument(
        "--paced-seconds", type=float, default=30.0, help="length of the paced phase"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--no-node-exporter", action="store_true", help="skip that column")
    parser.add_argument("--no-install", action="store_true", help="never apt-get install")
    args = parser.parse_args(argv)

    note = ""
    binary: str | None = None
    if args.no_node_exporter:
        note = "node-exporter column skipped (--no-node-exporter)"
    else:
        binary, note = node_exporter_binary(allow_install=not args.no_install)
        if binary is None:
            note = f"node-exporter column skipped: {note}"

    with tempfile.TemporaryDirectory(prefix="stormwatch-bench-") as tmp, processes() as procs:
        work = Path(tmp)
        (work / "metrics").mkdir()
        print(f">> {args.ranks} ranks writing multiprocess files", flush=True)
        start_ranks(args.ranks, work / "metrics", procs)
        print(f">> agent: {args.gpus} simulated GPUs x 18 NVLinks, 1 s sampling", flush=True)
        agent = start_agent(args, work, procs)
        targets = [agent]
        if binary is not None:
            targets.append(start_node_exporter(binary, work, procs))
        time.sleep(3)  # a few samples, GPM intervals, a P2P refresh
        print(f">> {args.scrapes} interleaved scrapes per target", flush=True)
        measure_scrapes(targets, args.scrapes)
        print(
            f">> a scrape every {args.paced_interval:g} s for {args.paced_seconds:.0f} s",
            flush=True,
        )
        measure_paced(targets, args.paced_interval, args.paced_seconds)
        for target in targets:
            target.close()
        print(f">> agent CPU over {args.cpu_seconds:.0f} s of sampling without scrapes", flush=True)
        time.sleep(3 * args.paced_interval + 1)  # the agent stops rendering ahead
        idle_share = measure_idle_cpu(agent, args.cpu_seconds)
        results: dict[str, Any] = {
            "setup": f"{args.gpus} sim GPUs x 18 NVLinks, {args.ranks} ranks, "
            f"{os.cpu_count()} CPUs",
            "cpu_seconds": args.cpu_seconds,
            "paced_interval": args.paced_interval,
            "loadavg": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        }
        for target in targets:
            rss, peak = target.memory()
            key = "agent" if target is agent else "node_exporter"
            results[key] = {
                "p50_s": percentile(target.latencies, 50),
                "p99_s": percentile(target.latencies, 99),
                "mean_s": statistics.fmean(target.latencies),
                "bytes": target.bytes,
                "series": target.series,
                "cpu_per_scrape_s": target.cpu_during_scrapes / len(target.latencies),
                "paced_p50_s": percentile(target.paced_latencies, 50),
                "paced_p99_s": percentile(target.paced_latencies, 99),
                "paced_cpu_share": target.paced_cpu,
                "rss_bytes": rss,
                "peak_rss_bytes": peak,
            }
        results["agent"]["cpu_idle_share"] = idle_share
    report(results, note)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
