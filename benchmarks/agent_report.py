"""The agent benchmark's in-process profile and its printed tables (``agent_bench.py``).

:func:`profile` runs the agent in this process, scraped like Prometheus, and splits its
CPU by thread (``thread_cpu.py``; a thread Python did not start is read in clock
ticks, 10 ms, so a profile of 20 s or more) and the render's by collector
(:attr:`~stormwatch.agent.collectors.base.CollectorSet.cpu_seconds`).
"""

from __future__ import annotations

import asyncio
import gc
import http.client
import threading
import time
from pathlib import Path
from typing import Any

from thread_cpu import cpu_by_thread, difference


def profile(
    *,
    gpus: int,
    metrics_dir: Path,
    state_dir: Path,
    interval: float,
    seconds: float,
    port: int,
    headers: dict[str, str],
) -> dict[str, Any]:
    """Run the agent (``gpus`` simulated GPUs, the ranks' files in ``metrics_dir``) in this
    process for ``seconds``, scraped on ``port`` every ``interval`` s with ``headers`` (the
    benchmark's: as Prometheus asks); its CPU (seconds) by thread, the render's, by
    collector, and the families encoded vs reused."""
    from stormwatch.agent.config import AgentConfig
    from stormwatch.agent.runtime import Agent

    loop_thread = "event loop (HTTP, timers)"

    async def run() -> dict[str, Any]:
        config = AgentConfig(
            listen_host="127.0.0.1",
            listen_port=port,
            node="bench",
            metrics_dir=metrics_dir,
            state_dir=state_dir,
            gpu_backend="sim",
            sim_gpus=gpus,
            sample_interval=1.0,
        )
        async with Agent(config) as agent:
            await asyncio.sleep(3)
            gc.freeze()  # as `stormwatch agent run` does once started

            def scrape_loop() -> None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                tick = start = time.monotonic()
                while tick < start + seconds:
                    conn.request("GET", "/metrics", headers=headers)
                    conn.getresponse().read()
                    tick += interval
                    time.sleep(max(0.0, tick - time.monotonic()))
                conn.close()

            collectors, cache = agent.collectors, agent.exposition
            cpu0, render0 = dict(collectors.cpu_seconds), cache.render_cpu_seconds
            fam0 = (collectors.rendered_families, collectors.reused_families, cache.renders)
            before, started = cpu_by_thread(loop_thread), time.monotonic()
            scraper = threading.Thread(target=scrape_loop, name="bench-scraper")
            scraper.start()
            while scraper.is_alive():
                await asyncio.sleep(0.2)
            used = difference(before, cpu_by_thread(loop_thread))
            elapsed = time.monotonic() - started
            by_thread: dict[str, float] = {}
            for name, cpu in used.items():
                if name == "bench-scraper":
                    continue
                if name.startswith("asyncio_"):
                    name = "executor (renders, fault expiry)"
                by_thread[name] = by_thread.get(name, 0.0) + cpu
            return {
                "seconds": elapsed,
                "threads": by_thread,
                "render": cache.render_cpu_seconds - render0,
                "collectors": {n: c - cpu0[n] for n, c in collectors.cpu_seconds.items()},
                "families_rendered": collectors.rendered_families - fam0[0],
                "families_reused": collectors.reused_families - fam0[1],
                "renders": cache.renders - fam0[2],
            }

    return asyncio.run(run())


def report(results: dict[str, Any], note: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=110)
    agent, node = results["agent"], results.get("node_exporter")
    asked = {"prometheus": "as Prometheus asks: OpenMetrics, gzip", "plain": "plain text"}
    every = f"every {results['interval']:g} s, {asked.get(results.get('scrape', ''), 'plain text')}"
    table = Table(title=f"agent vs node-exporter, scraped {every} ({results['setup']})")
    for column in ("measure", "agent", "node-exporter A", "ratio (min-max)", "target"):
        table.add_column(column, justify="left" if column == "measure" else "right")

    def span(r: dict[str, float]) -> str:
        return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})" if r else "-"

    def verdict(r: dict[str, float], limit: float) -> str:
        return f"<= {limit:g}x " + ("met" if r and r["median"] <= limit else "MISSED")

    cpu = [f"{100 * x:.2f} %" for x in (agent["cpu_share"], node["cpu_share"] if node else 0)]
    mib = [f"{x / 2**20:.1f} MiB" for x in (agent["rss"], node["rss"] if node else 0)]
    if node:
        table.add_row(
            "CPU share of one core",
            *cpu,
            span(results["cpu_ratio"]),
            verdict(results["cpu_ratio"], 3),
        )
        table.add_row(
            "A/A noise: node-exporter B / A, CPU", "", cpu[1], span(results["cpu_aa"]), ""
        )
        table.add_row(
            "resident memory (VmRSS)",
            *mib,
            span(results["rss_ratio"]),
            verdict(results["rss_ratio"], 2),
        )
        table.add_row(
            "A/A noise: node-exporter B / A, RSS", "", mib[1], span(results["rss_aa"]), ""
        )
        floors = results["rss_floors"]
        for label, key in (
            ("floor: python + prometheus_client + aiohttp.web only", "exporter"),
            ("floor: + the agent's other libraries (pydantic, OTel SDK, ...)", "libraries"),
        ):
            table.add_row(
                label,
                f"{floors[key] / 2**20:.1f} MiB",
                mib[1],
                f"{floors[key] / node['rss']:.2f}x",
                "why the RSS row can be missed",
            )
        table.add_row(
            "the agent's own code and state: RSS above the libraries' floor",
            f"{(agent['rss'] - floors['libraries']) / 2**20:.1f} MiB",
            "",
            "",
            "",
        )
        for label, key, scale in (("scrape p50", "p50", 1000), ("scrape p99", "p99", 1000)):
            a, n = agent[key] * scale, node[key] * scale
            table.add_row(f"{label} (ms)", f"{a:.2f}", f"{n:.2f}", f"{a / n:.2f}x", "")
        table.add_row("series", f"{agent['series']}", f"{node['series']}", "", "")
    else:
        table.add_row("CPU share of one core", cpu[0], "-", "-", "")
        table.add_row("resident memory (VmRSS)", mib[0], "-", "-", "")
    table.add_row(
        f"agent CPU, 1 s sampling, no scrapes ({results['idle_seconds']:g} s)",
        f"{100 * agent['idle_cpu_share']:.2f} %",
        "",
        "",
        "<= 2 %",
    )
    console.print(table)
    if node:
        print(
            "the RSS row on a GPU machine (projected, not measured): node-exporter's RSS does not "
            "grow with GPUs; the agent's libraries' floor is the same "
            f"{results['rss_floors']['libraries'] / 2**20:.1f} MiB "
            f"({results['rss_floors']['libraries'] / node['rss']:.2f}x here) plus NVML's own "
            "library once pynvml loads it, so the row stays above 2x there: its floor is the "
            "Python runtime and the libraries the agent is built on, not this machine"
        )
    prof = results.get("profile")
    if prof:
        seconds = prof["seconds"]
        where = Table(title=f"where the agent's CPU goes (in-process, {every}, {seconds:.0f} s)")
        where.add_column("phase")
        where.add_column("share of one core", justify="right")
        total = sum(prof["threads"].values())
        for name, cpu_s in sorted(prof["threads"].items(), key=lambda kv: -kv[1]):
            where.add_row(f"thread: {name}", f"{100 * cpu_s / seconds:.2f} %")
        where.add_row("total", f"{100 * total / seconds:.2f} %")
        where.add_row(
            f"render ({prof['renders']} renders; {prof['families_rendered']} families "
            f"encoded, {prof['families_reused']} reused)",
            f"{100 * prof['render'] / seconds:.2f} %",
        )
        for name, cpu_s in sorted(prof["collectors"].items(), key=lambda kv: -kv[1])[:6]:
            where.add_row(f"  collector {name}", f"{100 * cpu_s / seconds:.2f} %")
        console.print(where)
    if note:
        print(f"note: {note}")
    print(
        f"load average after the run: {results['loadavg']}; processes on the machine: "
        f"{results.get('processes', '?')} (the rank watcher lists them when one was "
        "created, exec'd or ended)"
    )


__all__ = ["profile", "report"]
