#!/usr/bin/env python3
"""Benchmark the node agent against prometheus-node-exporter on this machine.

Setup: one ``stormwatch agent run`` with a simulated 8-GPU node (18 NVLinks
per GPU, 1 s sampling) and 8 "ranks" (live processes) that wrote prometheus-client
multiprocess files: step-time histograms, per-collective-op duration
histograms and counters, and live gauges, like the trainer does. Next to it two
node-exporters: "A" is the baseline, "B" an identical copy whose ratio to A is the
A/A row (the noise of this machine).

Measured, side by side in one run, over ``--reps`` (3) repetitions of
``--seconds`` (30 s) each, every target scraped every ``--interval`` (1 s, the
target cadence) in the same loop (the order rotated each repetition):

* the CPU share of one core of each process while scraped (target: agent <= 3x
  node-exporter A);
* resident memory (``VmRSS``) at the end of each repetition (target: agent <= 2x);
  and two floors (printed as the reason rows): no Python exporter can go under an
  interpreter that imported only prometheus-client and aiohttp's server; and none built
  on the project's libraries can go under one that also loaded the rest of what the agent
  always runs on (click, pydantic with a model built, the OpenTelemetry SDK, pynvml,
  psutil, sqlite3). The agent's own code and state are what it holds above the second;
* scrape latency p50/p99 (pooled over the repetitions);
* the agent's CPU with 1 s sampling and no scrapes (``--idle-seconds``, 10 s).

Every scrape asks as Prometheus 2.x does (:data:`SCRAPE_HEADERS`: OpenMetrics first, and
``Accept-Encoding: gzip``), so each target does the encoding and compression a real
scrape costs it; ``--scrape plain`` asks for uncompressed text 0.0.4 (the benchmark's
scrapes before 2026-12-05 22:30 UTC).

Ratios are the median of the per-repetition ratios, with their min-max. Then,
with the targets stopped, a profile (``--profile-seconds``, 20 s): the same agent
in this process, scraped every ``--interval``, its CPU split by phase: per thread
(GPU sampling, rank watching, the HTTP event loop, the render executor), the
render by collector (:attr:`CollectorSet.cpu_seconds`; ``trainer`` is the merge of
the ranks' multiprocess files) and by what was re-encoded vs reused.

Usage::

    .venv/bin/python benchmarks/agent_bench.py [--gpus 8] [--ranks 8] [--reps 3]
        [--seconds 30] [--interval 1] [--json results.json] [--no-node-exporter]
        [--scrape prometheus|plain] [--quick]

node-exporter: the Debian package ``prometheus-node-exporter``. When the binary
is missing and we are root with apt, it is installed (with a message); otherwise
its columns are skipped with a note. Everything runs on 127.0.0.1 in a temporary
directory that is removed afterwards. Takes about 3 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
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
from agent_report import profile, report

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

_PRINT_RSS = "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS')))"

#: The memory floors (:func:`memory_floors`), each a program printing its VmRSS (KiB).
FLOOR_CODE = {
    # A Python exporter: the interpreter with prometheus-client and aiohttp's server.
    "exporter": "import prometheus_client, aiohttp.web\n" + _PRINT_RSS,
    # The libraries every `stormwatch agent run` loads, whatever it is asked: the CLI
    # (click), request and config models (pydantic builds its schema machinery with the
    # first model, so one is built), tracing (the OpenTelemetry SDK and its batch
    # processor), NVML's bindings, psutil (the rank watcher) and sqlite3 (the fault
    # ledger). Not counted: what loads only when used (the fault registry, YAML and bcrypt
    # for a web config, the OTLP exporters).
    "libraries": (
        "import prometheus_client, aiohttp.web, click, pydantic, psutil, pynvml, sqlite3\n"
        "import opentelemetry.sdk.trace, opentelemetry.sdk.trace.export\n"
        "class Floor(pydantic.BaseModel):\n"
        "    port: int = 0\n"
        "Floor.model_validate({'port': 1})\n" + _PRINT_RSS
    ),
}


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


def vm_rss(pid: int | str = "self") -> int:
    """``VmRSS`` of a process, bytes (0 when it is gone)."""
    with contextlib.suppress(OSError, StopIteration):
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        return int(next(x for x in lines if x.startswith("VmRSS:")).split()[1]) * 1024
    return 0


#: What a scrape asks for, by ``--scrape``: ``prometheus`` is Prometheus 2.x's own Accept
#: header (its ``scrapeAcceptHeader``: OpenMetrics 1.0.0, 0.0.1, then text 0.0.4) and gzip.
SCRAPE_HEADERS: dict[str, dict[str, str]] = {
    "prometheus": {
        "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
        "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        "Accept-Encoding": "gzip",
    },
    "plain": {"Accept": "text/plain"},
}


class Target:
    """A process serving /metrics on 127.0.0.1, scraped over one keep-alive connection."""

    def __init__(
        self, name: str, proc: subprocess.Popen[bytes], port: int, headers: dict[str, str]
    ) -> None:
        self.name, self.proc, self.port, self.headers = name, proc, port, headers
        self.ps = psutil.Process(proc.pid)
        self._conn: http.client.HTTPConnection | None = None
        self.latencies: list[float] = []
        self.cpu_shares: list[float] = []
        self.rss: list[int] = []
        self.bytes = 0
        self.series = 0

    def scrape(self) -> float:
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        started = time.perf_counter()
        self._conn.request("GET", "/metrics", headers=self.headers)
        reply = self._conn.getresponse()
        body = reply.read()
        elapsed = time.perf_counter() - started
        if reply.status != 200:
            raise SystemExit(f"{self.name}: /metrics answered {reply.status}")
        self.bytes = len(body)  # as sent (compressed, when gzip was asked and given)
        if reply.getheader("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        return elapsed

    def cpu_seconds(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

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


def agent_options(args: argparse.Namespace, work: Path, port: int) -> list[str]:
    return [
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
    ]


def start_agent(args: argparse.Namespace, work: Path, procs: list[Any]) -> Target:
    port = free_port()
    script = Path(sys.executable).with_name("stormwatch")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "stormwatch.cli"]
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    log = (work / "agent.log").open("wb")
    proc = subprocess.Popen(
        [*command, "agent", "run", *agent_options(args, work, port)],
        stdout=log,
        stderr=log,
        env=env,
    )
    procs.append(proc)
    wait_http("127.0.0.1", port, "/healthz")
    return Target("agent", proc, port, SCRAPE_HEADERS[args.scrape])


def start_node_exporter(
    binary: str, name: str, work: Path, procs: list[Any], headers: dict[str, str]
) -> Target:
    port = free_port()
    log = (work / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log
    )
    procs.append(proc)
    wait_http("127.0.0.1", port, "/metrics")
    return Target(name, proc, port, headers)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def measure_paced(targets: list[Target], interval: float, seconds: float) -> None:
    """One repetition: scrape each target every ``interval`` s for ``seconds`` s, like
    Prometheus; appends each target's CPU share of one core and its RSS."""
    before = [t.cpu_seconds() for t in targets]
    started = time.monotonic()
    deadline, tick = started + seconds, started
    while tick < deadline:
        for target in targets:
            target.latencies.append(target.scrape())
        tick += interval
        time.sleep(max(0.0, tick - time.monotonic()))
    elapsed = time.monotonic() - started
    for target, cpu in zip(targets, before, strict=True):
        target.cpu_shares.append((target.cpu_seconds() - cpu) / elapsed)
        target.rss.append(vm_rss(target.proc.pid))


def measure_idle_cpu(target: Target, seconds: float) -> float:
    start_cpu, start = target.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    return (target.cpu_seconds() - start_cpu) / (time.monotonic() - start)


def memory_floors() -> dict[str, int]:
    """RSS (bytes) of this interpreter after each of :data:`FLOOR_CODE`'s programs."""
    floors = {}
    for name, code in FLOOR_CODE.items():
        out = subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        )
        floors[name] = int(out.stdout.strip()) * 1024
    return floors


def ratios(numerator: list[float], denominator: list[float]) -> dict[str, float]:
    """Median, min and max of the per-repetition ratios."""
    values = [n / d for n, d in zip(numerator, denominator, strict=True) if d]
    if not values:
        return {}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (18 NVLinks each)")
    parser.add_argument("--ranks", type=int, default=8, help="simulated ranks' metric files")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (>= 1)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of a repetition")
    parser.add_argument("--interval", type=float, default=1.0, help="scrape interval (s)")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="no-scrape window")
    parser.add_argument("--profile-seconds", type=float, default=20.0, help="0: no profile")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--no-node-exporter", action="store_true", help="skip those columns")
    parser.add_argument("--no-install", action="store_true", help="never apt-get install")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 2 GPUs, 2 ranks, one 4 s repetition, 2 s idle, 3 s profile; "
        "never installs node-exporter (its columns are skipped without it)",
    )
    parser.add_argument(
        "--scrape",
        choices=sorted(SCRAPE_HEADERS),
        default="prometheus",
        help="ask as Prometheus does (OpenMetrics, gzip; the default) or for plain text",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.gpus, args.ranks, args.reps, args.seconds = 2, 2, 1, 4.0
        args.idle_seconds, args.profile_seconds, args.no_install = 2.0, 3.0, True
    if args.reps < 1:
        parser.error("--reps must be >= 1")

    note = ""
    binary: str | None = None
    if args.no_node_exporter:
        note = "node-exporter columns skipped (--no-node-exporter)"
    else:
        binary, note = node_exporter_binary(allow_install=not args.no_install)
        if binary is None:
            note = f"node-exporter columns skipped: {note}"

    results: dict[str, Any] = {
        "setup": f"{args.gpus} sim GPUs x 18 NVLinks, {args.ranks} ranks, {os.cpu_count()} CPUs",
        "interval": args.interval,
        "idle_seconds": args.idle_seconds,
        "reps": args.reps,
        "scrape": args.scrape,
    }
    with tempfile.TemporaryDirectory(prefix="stormwatch-bench-") as tmp, processes() as procs:
        work = Path(tmp)
        (work / "metrics").mkdir()
        print(f">> {args.ranks} ranks writing multiprocess files", flush=True)
        start_ranks(args.ranks, work / "metrics", procs)
        print(f">> agent: {args.gpus} simulated GPUs x 18 NVLinks, 1 s sampling", flush=True)
        agent = start_agent(args, work, procs)
        targets = [agent]
        if binary is not None:
            targets += [
                start_node_exporter(
                    binary, f"node-exporter {n}", work, procs, SCRAPE_HEADERS[args.scrape]
                )
                for n in "AB"
            ]
        time.sleep(3)  # a few samples, GPM intervals, a P2P refresh
        for target in targets:  # warm up: first scrapes compile, fill caches, open connections
            for _ in range(3):
                target.scrape()
        for rep in range(args.reps):
            order = targets[rep % len(targets) :] + targets[: rep % len(targets)]
            print(f">> repetition {rep + 1}/{args.reps}: {args.seconds:.0f} s", flush=True)
            measure_paced(order, args.interval, args.seconds)
        for target in targets:
            target.close()
        print(f">> agent CPU over {args.idle_seconds:.0f} s without scrapes", flush=True)
        time.sleep(3 * args.interval + 1)  # the agent stops rendering ahead
        idle = measure_idle_cpu(agent, args.idle_seconds)
        for target in targets:
            key = {"agent": "agent", "node-exporter A": "node_exporter"}.get(target.name, "ne_b")
            results[key] = {
                "cpu_share": statistics.median(target.cpu_shares),
                "cpu_shares": target.cpu_shares,
                "rss": statistics.median(target.rss),
                "rss_samples": target.rss,
                "p50": percentile(target.latencies, 50),
                "p99": percentile(target.latencies, 99),
                "series": target.series,
                "bytes": target.bytes,
            }
        results["agent"]["idle_cpu_share"] = idle
        if binary is not None:
            a, b, n = agent, targets[1], targets[2]
            results["cpu_ratio"] = ratios(a.cpu_shares, b.cpu_shares)
            results["cpu_aa"] = ratios(n.cpu_shares, b.cpu_shares)
            results["rss_ratio"] = ratios([float(x) for x in a.rss], [float(x) for x in b.rss])
            results["rss_aa"] = ratios([float(x) for x in n.rss], [float(x) for x in b.rss])
            results["rss_floors"] = memory_floors()
        for target in targets:  # the profile runs alone
            target.proc.terminate()
            target.proc.wait(15)
        if args.profile_seconds > 0:
            print(f">> profile: the agent in-process for {args.profile_seconds:.0f} s", flush=True)
            results["profile"] = profile(
                gpus=args.gpus,
                metrics_dir=work / "metrics",
                state_dir=work / "profile-state",
                interval=args.interval,
                seconds=args.profile_seconds,
                port=free_port(),
                headers=SCRAPE_HEADERS[args.scrape],
            )
        results["loadavg"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
        # the rank watcher scans every process on the machine: its cost grows with them
        results["processes"] = sum(name.isdigit() for name in os.listdir("/proc"))
    report(results, note)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
