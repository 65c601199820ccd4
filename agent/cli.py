"""``stormwatch agent``: run the node agent, or print its metric catalogue."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import signal
import sys
from pathlib import Path

import click

from stormwatch.agent.catalogue import load_catalogue
from stormwatch.agent.config import COLLECTOR_NAMES, AgentConfig, parse_listen
from stormwatch.agent.runtime import Agent


@click.group("agent")
def agent() -> None:
    """Run or inspect the per-node agent (metrics, rank watcher, fault API)."""


@agent.command("run")
@click.option(
    "--listen",
    default="0.0.0.0:9400",
    show_default=True,
    envvar="STORMWATCH_AGENT_LISTEN",
    help="HOST:PORT to serve on (port 0: any free port, printed at start).",
)
@click.option(
    "--node",
    envvar="STORMWATCH_AGENT_NODE",
    help="Node name (Hostname label). [default: host name]",
)
@click.option(
    "--metrics-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    envvar="STORMWATCH_AGENT_METRICS_DIR",
    help="The ranks' STORMWATCH_METRICS_DIR (multiprocess files, rank<R>.done markers).",
)
@click.option(
    "--gpu-backend",
    type=click.Choice(["auto", "nvml", "sim"]),
    default="auto",
    show_default=True,
    envvar="STORMWATCH_AGENT_GPU_BACKEND",
    help="nvml: the driver (required); sim: simulated GPUs; auto: nvml when a driver answers.",
)
@click.option(
    "--sim-gpus",
    type=int,
    default=2,
    show_default=True,
    envvar="STORMWATCH_AGENT_SIM_GPUS",
    help="GPUs to simulate.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="STORMWATCH_AGENT_TOKEN_FILE",
    help="File with the fault API's Bearer token; without it the fault API answers 401.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="STORMWATCH_AGENT_STATE_DIR",
    help="Where the fault ledger (and by default the span file) lives. "
    "[default: $XDG_STATE_HOME/stormwatch/agent/<node>]",
)
@click.option(
    "--sample-interval",
    type=float,
    default=1.0,
    show_default=True,
    envvar="STORMWATCH_AGENT_SAMPLE_INTERVAL",
    help="Seconds between NVML samples; scrapes serve the latest sample.",
)
@click.option(
    "--disable-collector",
    "disabled",
    multiple=True,
    type=click.Choice(COLLECTOR_NAMES),
    envvar="STORMWATCH_AGENT_DISABLE_COLLECTOR",
    help="Switch a collector off (repeatable; env: space-separated names).",
)
@click.option(
    "--otlp-endpoint",
    envvar="STORMWATCH_AGENT_OTLP_ENDPOINT",
    help="Send the agent's spans (fault inject/revert, rank exits, collector failures) to this "
    "OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (needs "
    "`pip install opentelemetry-exporter-otlp-proto-http`).",
)
@click.option(
    "--trace-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="STORMWATCH_AGENT_TRACE_FILE",
    help="Append the agent's spans as JSON lines here when no --otlp-endpoint is given. "
    "[default: <state-dir>/traces.jsonl]",
)
@click.option(
    "--trace-flush-timeout",
    type=float,
    default=3.0,
    show_default=True,
    envvar="STORMWATCH_AGENT_TRACE_FLUSH_TIMEOUT",
    help="Seconds a span export or the final flush may take; bounds the agent's exit when "
    "the collector hangs (FC-08).",
)
def run(
    listen: str,
    node: str | None,
    metrics_dir: Path,
    gpu_backend: str,
    sim_gpus: int,
    token_file: Path | None,
    state_dir: Path | None,
    sample_interval: float,
    disabled: tuple[str, ...],
    otlp_endpoint: str | None,
    trace_file: Path | None,
    trace_flush_timeout: float,
) -> int:
    """Serve /metrics, /healthz, /v1/ranks and the fault API until SIGTERM or SIGINT.

    \b
    Example:
      stormwatch agent run --listen 0.0.0.0:9400 --node node0 \\
          --metrics-dir /run/stormwatch/metrics --token-file /etc/stormwatch/agent.token
    """
    host, port = parse_listen(listen)
    values: dict[str, object] = {
        "listen_host": host,
        "listen_port": port,
        "metrics_dir": metrics_dir,
        "gpu_backend": gpu_backend,
        "sim_gpus": sim_gpus,
        "token_file": token_file,
        "state_dir": state_dir,
        "sample_interval": sample_interval,
        "disabled_collectors": frozenset(disabled),
        "otlp_endpoint": otlp_endpoint or None,
        "trace_file": trace_file,
        "trace_flush_timeout": trace_flush_timeout,
    }
    if node:
        values["node"] = node
    config = AgentConfig.build(**values)
    asyncio.run(_serve(config))
    return 0


async def _serve(config: AgentConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with Agent(config) as node_agent:
            click.echo(
                f"stormwatch agent {config.node}: listening on {node_agent.url} "
                f"(GPU backend {node_agent.gpu_backend}; spans to {node_agent.trace_destination})",
                err=True,
            )
            await stop.wait()
            click.echo(f"stormwatch agent {config.node}: stopping", err=True)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)


@agent.command("metrics")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="table: rich table; csv: the catalogue file's columns; json: a list of objects.",
)
def metrics(fmt: str) -> None:
    """Print the metric catalogue: every metric the agent exports, with type, unit and labels."""
    catalogue = load_catalogue()
    if fmt == "json":
        click.echo(json.dumps([spec.model_dump(mode="json") for spec in catalogue], indent=2))
        return
    if fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["name", "type", "unit", "labels", "source", "help"])
        for spec in catalogue:
            writer.writerow(
                [spec.name, spec.type, spec.unit, " ".join(spec.labels), spec.source, spec.help]
            )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"stormwatch agent metrics ({len(catalogue)})")
    table.add_column("name", no_wrap=True)  # names are copied into queries: never fold them
    for column in ("type", "unit", "labels", "source", "help"):
        table.add_column(column, overflow="fold")
    for spec in catalogue:
        table.add_row(
            spec.name, spec.type, spec.unit, ",".join(spec.labels), spec.source, spec.help
        )
    Console().print(table)


__all__ = ["agent"]
