"""``stormwatch agent``: run the node agent, or print its metric catalogue."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import gc
import json
import re
import signal
import sys
from pathlib import Path
from typing import Any

import click

from stormwatch.agent.catalogue import MetricSpec, load_catalogue
from stormwatch.agent.config import COLLECTOR_NAMES, AgentConfig, parse_listen
from stormwatch.agent.errors import AgentConfigError
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
    help="nvml: the driver (required); sim: simulated GPUs; auto: nvml when a driver "
    "answers, else no GPU metrics (a warning).",
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
    help="File with the fault API's Bearer token (required with --fault-api-listen).",
)
@click.option(
    "--fault-api-listen",
    envvar="STORMWATCH_AGENT_FAULT_API_LISTEN",
    metavar="HOST:PORT",
    help="Serve the fault API (POST/GET/DELETE /v1/faults, Bearer token) on its own "
    "listener here. [default: off, nothing listens]",
)
@click.option(
    "--web-config-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="STORMWATCH_AGENT_WEB_CONFIG_FILE",
    help="Prometheus exporter web-config file (tls_server_config, basic_auth_users with bcrypt "
    "hashes): TLS for both listeners, basic auth for /metrics and the read-only endpoints.",
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
    "--rendezvous-probe-interval",
    type=float,
    default=1.0,
    show_default=True,
    envvar="STORMWATCH_AGENT_RENDEZVOUS_PROBE_INTERVAL",
    help="Seconds between TCP probes of each local job's rendezvous store (one connection "
    "each to the store's host; raise it for jobs of hundreds of nodes).",
)
@click.option(
    "--disable-collector",
    "disabled",
    multiple=True,
    type=click.Choice(COLLECTOR_NAMES),
    envvar="STORMWATCH_AGENT_DISABLE_COLLECTOR",
    help="Switch a collector off (repeatable; STORMWATCH_AGENT_DISABLE_COLLECTOR: names "
    "separated by spaces).",
)
@click.option(
    "--otlp-endpoint",
    envvar="STORMWATCH_AGENT_OTLP_ENDPOINT",
    help="Send the agent's spans (fault inject/revert, rank exits, collector failures) to this "
    "OTLP/HTTP collector base URL, as OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://127.0.0.1:4318.",
)
@click.option(
    "--trace-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="STORMWATCH_AGENT_TRACE_FILE",
    help="Append the agent's spans as JSON lines here when no OTLP endpoint is configured "
    "(--otlp-endpoint, else OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT). "
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
@click.option(
    "--claim-unlabelled-ranks/--no-claim-unlabelled-ranks",
    default=True,
    show_default=True,
    envvar="STORMWATCH_AGENT_CLAIM_UNLABELLED_RANKS",
    help="Treat ranks that name no metrics dir (no STORMWATCH_METRICS_DIR, no --metrics-dir "
    "after `train`) as this node's, so they are watched and may be killed by the fault API. "
    "Keep on with one agent per host; pass --no-claim-unlabelled-ranks when several agents "
    "share one PID namespace (the lab).",
)
@click.option(
    "--hang-floor-seconds",
    type=float,
    default=5.0,
    show_default=True,
    envvar="STORMWATCH_AGENT_HANG_FLOOR_SECONDS",
    help="A running rank is hung when its last heartbeat is older than "
    "max(this, --hang-factor x the job's recent median step time).",
)
@click.option(
    "--hang-factor",
    type=float,
    default=3.0,
    show_default=True,
    envvar="STORMWATCH_AGENT_HANG_FACTOR",
    help="Multiple of the job's recent median step time in the hang threshold.",
)
@click.option(
    "--hang-warmup-steps",
    type=int,
    default=3,
    show_default=True,
    envvar="STORMWATCH_AGENT_HANG_WARMUP_STEPS",
    help="Steps a new rank process completes before the threshold above applies.",
)
@click.option(
    "--hang-warmup-seconds",
    type=float,
    default=60.0,
    show_default=True,
    envvar="STORMWATCH_AGENT_HANG_WARMUP_SECONDS",
    help="Hang threshold while a rank process warms up, and for jobs without step marks.",
)
@click.option(
    "--straggler-factor",
    type=float,
    default=1.2,
    show_default=True,
    envvar="STORMWATCH_AGENT_STRAGGLER_FACTOR",
    help="A step is slow when the rank's compute time is at least this times its peers' "
    "median while the peers wait longer in collectives (FC-14).",
)
@click.option(
    "--straggler-samples",
    type=int,
    default=3,
    show_default=True,
    envvar="STORMWATCH_AGENT_STRAGGLER_SAMPLES",
    help="Consecutive slow steps before a rank is flagged as a straggler.",
)
@click.option(
    "--pod-resources-socket",
    default=None,
    envvar="STORMWATCH_AGENT_POD_RESOURCES_SOCKET",
    help="The kubelet's pod-resources socket (/var/lib/kubelet/pod-resources/kubelet.sock): "
    "GPU series get namespace, pod and container labels, like dcgm-exporter's. Unset: off.",
)
def run(
    listen: str,
    node: str | None,
    metrics_dir: Path,
    gpu_backend: str,
    sim_gpus: int,
    token_file: Path | None,
    fault_api_listen: str | None,
    web_config_file: Path | None,
    state_dir: Path | None,
    sample_interval: float,
    rendezvous_probe_interval: float,
    disabled: tuple[str, ...],
    otlp_endpoint: str | None,
    trace_file: Path | None,
    trace_flush_timeout: float,
    claim_unlabelled_ranks: bool,
    hang_floor_seconds: float,
    hang_factor: float,
    hang_warmup_steps: int,
    hang_warmup_seconds: float,
    straggler_factor: float,
    straggler_samples: int,
    pod_resources_socket: str | None,
) -> int:
    """Serve /metrics, /healthz, /v1/ranks, /v1/events (and, when enabled, the fault API
    on its own listener) until SIGTERM or SIGINT.

    \b
    Example:
      stormwatch agent run --listen 0.0.0.0:9400 --node node0 \\
          --metrics-dir /run/stormwatch/metrics --web-config-file /etc/stormwatch/web.yml \\
          --fault-api-listen 10.0.0.5:9401 --token-file /etc/stormwatch/agent.token
    """
    if token_file is not None and not fault_api_listen:
        source = click.get_current_context().get_parameter_source("token_file")
        given = (
            "$STORMWATCH_AGENT_TOKEN_FILE"
            if source is click.core.ParameterSource.ENVIRONMENT
            else "--token-file"
        )
        raise click.UsageError(
            f"{given} is only used by the fault API, which is off without --fault-api-listen: "
            "add --fault-api-listen HOST:PORT to serve it, or drop --token-file"
        )
    host, port = parse_listen(listen, field="listen (--listen)")
    values: dict[str, object] = {
        "listen_host": host,
        "listen_port": port,
        "metrics_dir": metrics_dir,
        "gpu_backend": gpu_backend,
        "sim_gpus": sim_gpus,
        "token_file": token_file,
        "web_config_file": web_config_file,
        "state_dir": state_dir,
        "sample_interval": sample_interval,
        "rendezvous_probe_interval": rendezvous_probe_interval,
        "disabled_collectors": frozenset(disabled),
        "otlp_endpoint": otlp_endpoint or None,
        "trace_file": trace_file,
        "trace_flush_timeout": trace_flush_timeout,
        "claim_unlabelled_ranks": claim_unlabelled_ranks,
        "hang_floor_seconds": hang_floor_seconds,
        "hang_factor": hang_factor,
        "hang_warmup_steps": hang_warmup_steps,
        "hang_warmup_seconds": hang_warmup_seconds,
        "straggler_factor": straggler_factor,
        "straggler_samples": straggler_samples,
        "pod_resources_socket": pod_resources_socket,
    }
    if fault_api_listen:
        fault_host, fault_port = parse_listen(
            fault_api_listen, field="fault_listen (--fault-api-listen)"
        )
        values["fault_listen_host"] = fault_host
        values["fault_listen_port"] = fault_port
    if node is not None:  # given, even empty: the config refuses an empty name
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
                f"(fault API {'on ' + node_agent.fault_url if node_agent.fault_url else 'off'}; "
                f"GPU backend {node_agent.gpu_backend}; spans to {node_agent.trace_destination})",
                err=True,
            )
            # What start-up made (modules, the catalogue, settings) lives as long as the
            # process: keep it out of the cyclic GC's full collections, which otherwise walk
            # it at every one (~0.15 % of a core at 1 s sampling and scrapes,
            # benchmarks/agent_bench.py). The process is the CLI's, so the choice is too.
            gc.freeze()
            await stop.wait()
            click.echo(f"stormwatch agent {config.node}: stopping", err=True)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            # The loop is ending with the process: a handler it cannot remove goes with it.
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)


#: Terminal width from which the default table also shows the help column.
HELP_COLUMN_MIN_WIDTH = 120


@agent.command("metrics")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="table: one line per metric; csv: the catalogue file's columns; json: a list of objects.",
)
@click.option(
    "--grep",
    "pattern",
    metavar="PATTERN",
    help="Only metrics whose name matches this regular expression (case-insensitive search).",
)
@click.option(
    "--wide",
    is_flag=True,
    help="Table: add the source column and the full help text (wrapped).",
)
def metrics(fmt: str, pattern: str | None, wide: bool) -> None:
    """Print the metric catalogue: every metric the agent exports, with type, unit and labels.

    The table has one line per metric (name, type, unit, labels); from
    120 columns on it adds the help text, cut with an ellipsis; --wide shows
    everything. Long label lists are cut with an ellipsis too: use --wide,
    --format csv or --format json for the whole row.

    A --grep that matches nothing says so on stderr and prints no table (csv:
    the header only; json: []); it still exits 0.

    \b
    Examples:
      stormwatch agent metrics --grep '^DCGM_FI_DEV_.*TEMP'
      stormwatch agent metrics --grep collective --wide
    """
    specs = list(load_catalogue())
    if pattern is not None:
        try:
            regex = re.compile(pattern, re.IGNORECASE)
        except re.error as exc:
            raise AgentConfigError(
                f"--grep: invalid regular expression {pattern!r}: {exc}"
            ) from exc
        matched = [spec for spec in specs if regex.search(spec.name)]
        if not matched:
            # On stderr: csv and json stay valid (a header, []); the table is not printed.
            click.echo(
                f"no metric matches {pattern!r} ({len(specs)} metrics in the catalogue)", err=True
            )
        specs = matched
    if fmt == "json":
        click.echo(json.dumps([spec.model_dump(mode="json") for spec in specs], indent=2))
        return
    if fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["name", "type", "unit", "labels", "source", "help"])
        for spec in specs:
            writer.writerow(
                [spec.name, spec.type, spec.unit, " ".join(spec.labels), spec.source, spec.help]
            )
        return
    if specs:
        _print_table(specs, wide=wide)


def _print_table(specs: list[MetricSpec], *, wide: bool) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    show_help = wide or console.width >= HELP_COLUMN_MIN_WIDTH

    # One line per metric unless --wide. Names are copied into queries: never cut
    # or folded (the column is as wide as the longest shown name); labels and help
    # take what is left, cut with an ellipsis. Widths are set here, not left to
    # rich, which would drop whole columns on a narrow terminal.
    def widest(header: str, values: list[str]) -> int:
        return max([len(header), *(len(value) for value in values)])

    name_w = widest("name", [spec.name for spec in specs])
    type_w = widest("type", [spec.type for spec in specs])
    unit_w = widest("unit", [spec.unit for spec in specs])
    if not wide:
        unit_w = min(unit_w, 8)  # bytes_per_second -> bytes_p…
    source_w = widest("source", [spec.source for spec in specs]) if wide else 0
    columns = 4 + (1 if show_help else 0) + (1 if wide else 0)
    # Each column but the last is followed by one space of padding and one of
    # rule (rich's widths include the padding).
    rest = console.width - name_w - type_w - unit_w - source_w - 2 * (columns - 1)
    labels_w = max(6, rest // 3 if show_help else rest)
    help_w = max(10, rest - labels_w)
    table = Table(
        title=f"stormwatch agent metrics ({len(specs)})",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        expand=False,
    )
    cut: dict[str, Any] = (
        {"overflow": "fold"} if wide else {"no_wrap": True, "overflow": "ellipsis"}
    )
    table.add_column("name", no_wrap=True, width=name_w + 1)
    table.add_column("type", no_wrap=True, width=type_w + 1)
    table.add_column("unit", width=unit_w + 1, **cut)
    table.add_column("labels", width=labels_w + (1 if wide or show_help else 0), **cut)
    if wide:
        table.add_column("source", no_wrap=True, width=source_w + (1 if show_help else 0))
    if show_help:
        table.add_column("help", width=help_w, **cut)
    for spec in specs:
        row = [spec.name, spec.type, spec.unit, " ".join(spec.labels)]
        if wide:
            row.append(spec.source)
        if show_help:
            row.append(spec.help)
        table.add_row(*row)
    console.print(table, crop=not wide)


__all__ = ["agent"]
