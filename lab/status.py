"""What ``lab status`` reports (nodes, services and jobs, with live health probes), and how
it prints them."""

from __future__ import annotations

import ipaddress
import shlex
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.console import Console
from rich.markup import escape

from stormwatch.lab.config import LabConfig
from stormwatch.lab.jobs import launch
from stormwatch.lab.netns import NetworkLayer
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.services import health, procs
from stormwatch.lab.state import LabState, Phase, SlurmState
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.slurm import SlurmCommands
from stormwatch.tables import Col, one_line_table, short_age


class ServiceStatus(BaseModel):
    """One service process.

    Attributes:
        running: its process is alive (pid and start time match).
        healthy: its health URL answered 2xx just now.
        detail: the probe's outcome (``HTTP 200``, or the error).
        returncode: its exit status when it has exited and it was recorded.
    """

    name: str
    pid: int
    running: bool
    healthy: bool
    detail: str
    url: str
    log_file: Path
    returncode: int | None = None


class NodeStatus(BaseModel):
    """One node: its namespace exists, and its agent."""

    name: str
    netns: str
    address: ipaddress.IPv4Address
    netns_exists: bool
    agent: ServiceStatus | None


class JobStatus(BaseModel):
    """One job: ``exit_codes`` per node (``None`` while running or unknown).

    Attributes:
        problem: why a running job can never finish (a node's torchrun is gone
            while the others wait), with what to do; ``None`` otherwise.
    """

    name: str
    running: bool
    stopped: bool
    started_at: float
    exit_codes: dict[str, int | None]
    job_dir: Path
    problem: str | None = None


class SlurmStatus(BaseModel):
    """The lab's Slurm cluster as ``scontrol show node`` reports it just now.

    Attributes:
        healthy: slurmctld answered and every node is in service (``IDLE``, ``MIXED``,
            ``ALLOCATED`` or ``COMPLETING``, without ``DRAIN``/``NOT_RESPONDING``).
        nodes: node -> its state (``IDLE``, ``IDLE+DRAIN`` ...; ``unknown`` when missing).
        reasons: node -> why it is drained or down, for the nodes that have one.
        detail: slurmctld's error when it did not answer; ``None`` otherwise.
    """

    controller: str
    conf: Path
    healthy: bool
    nodes: dict[str, str]
    reasons: dict[str, str] = {}
    detail: str | None = None


#: Base states of a node in service, and flags that take it out.
_IN_SERVICE = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
_OUT_FLAGS = frozenset({"DRAIN", "NOT_RESPONDING", "FAIL", "MAINT"})


def slurm_status(slurm: SlurmState) -> SlurmStatus:
    """Read the lab's Slurm nodes once (a slurmctld that does not answer is unhealthy)."""
    controller = f"{slurm.controller_address}:{slurm.controller_port}"
    try:
        found = SlurmCommands(conf=slurm.conf, timeout_s=10.0).nodes()
    except BackendError as exc:
        nodes = dict.fromkeys(slurm.nodes, "unknown")
        return SlurmStatus(
            controller=controller, conf=slurm.conf, healthy=False, nodes=nodes, detail=str(exc)
        )
    nodes = {n: found[n].state if n in found else "unknown" for n in slurm.nodes}
    reasons = {n: r for n in slurm.nodes if n in found and (r := found[n].reason)}
    healthy = all(
        n in found and found[n].base_state in _IN_SERVICE and not found[n].flags & _OUT_FLAGS
        for n in slurm.nodes
    )
    return SlurmStatus(
        controller=controller, conf=slurm.conf, healthy=healthy, nodes=nodes, reasons=reasons
    )


class LabStatus(BaseModel):
    """The whole lab; ``healthy`` is true when it is up and every check passed (the Slurm
    nodes in service included)."""

    run_dir: Path
    phase: Phase
    healthy: bool
    prometheus_url: str
    alertmanager_url: str
    responder_url: str
    nodes: list[NodeStatus]
    services: list[ServiceStatus]
    jobs: list[JobStatus]
    slurm: SlurmStatus | None = None
    error: str | None = None
    #: The lab's target file (``lab up`` writes it), None when there is none.
    target_file: Path | None = None
    #: The lab's configuration, for the ``lab up`` line of a lab that is down (not in
    #: ``--json``, which is as before).
    config: LabConfig | None = Field(default=None, exclude=True)


def _health_urls(state: LabState) -> dict[str, str]:
    urls = {f"agent-{n.name}": f"{n.agent_url}/healthz" for n in state.nodes}
    urls["prometheus"] = f"{state.prometheus_url}/-/ready"
    urls["alertmanager"] = f"{state.alertmanager_url}/-/ready"
    urls["responder"] = f"{state.responder_url}/healthz"
    return urls


def collect_status(state: LabState, network: NetworkLayer) -> LabStatus:
    """Probe the lab described by ``state`` once."""
    urls = {name: url for name, url in _health_urls(state).items() if name in state.processes}
    probes = health.check_urls(urls) if state.phase == "up" else {}
    services = {}
    for name, record in state.processes.items():
        probe = probes.get(name, health.Health(False, "not probed"))
        services[name] = ServiceStatus(
            name=name,
            pid=record.pid,
            running=procs.is_running(record),
            healthy=probe.ok,
            detail=probe.detail,
            url=urls.get(name, ""),
            log_file=record.log_file,
            returncode=procs.exit_status(record).returncode,
        )
    existing = set(network.namespaces())
    nodes = [
        NodeStatus(
            name=node.name,
            netns=node.netns,
            address=node.address,
            netns_exists=node.netns in existing,
            agent=services.get(f"agent-{node.name}"),
        )
        for node in state.nodes
    ]
    job_list = []
    for name, record in state.jobs.items():
        result = launch.result(record)
        running = launch.is_running(record)
        job_list.append(
            JobStatus(
                name=name,
                running=running,
                problem=launch.stranded(record) if running else None,
                stopped=record.stopped,
                started_at=record.info.started_at,
                exit_codes=result.exit_codes,
                job_dir=record.info.job_dir,
            )
        )
    slurm = slurm_status(state.slurm) if state.slurm is not None and state.phase == "up" else None
    healthy = (
        state.phase == "up"
        and all(n.netns_exists for n in nodes)
        and bool(services)
        and all(s.running and s.healthy for s in services.values())
        and (slurm is None or slurm.healthy)
    )
    return LabStatus(
        run_dir=state.run_dir,
        phase=state.phase,
        healthy=healthy,
        prometheus_url=state.prometheus_url,
        alertmanager_url=state.alertmanager_url,
        responder_url=state.responder_url,
        nodes=nodes,
        services=[s for s in services.values() if not s.name.startswith("agent-")],
        jobs=job_list,
        slurm=slurm,
        error=state.error,
        target_file=target
        if (target := RunPaths.of(state.run_dir).target_file).is_file()
        else None,
        config=state.config,
    )


#: From this terminal width on, ``lab status`` also shows namespaces, addresses, URLs and
#: job folders; narrower, each table keeps the columns that say what is wrong.
STATUS_WIDE_COLUMNS = 120


def _service_cells(service: ServiceStatus | None) -> list[str]:
    """pid, process and health of a service (or of a node's agent)."""
    if service is None:
        return ["-", "[red]not started[/]", ""]
    running = "[green]running[/]" if service.running else f"[red]exited {service.returncode}[/]"
    healthy = "[green]healthy[/]" if service.healthy else f"[red]{escape(service.detail)}[/]"
    return [str(service.pid), running, healthy]


def render_status(
    status: LabStatus, console: Console, *, up_flags: Iterable[tuple[str, str, Any, str]] = ()
) -> None:
    """Print ``status`` as ``lab status`` does: a verdict line, then nodes, services and
    jobs tables with one line per row at the console's width (narrower than
    :data:`STATUS_WIDE_COLUMNS`: without namespaces, addresses, URLs and job folders).
    A lab that is down gets one line saying so and how to start it (``lab up`` with the
    options of ``up_flags`` that give its configuration: :func:`up_options`), and its jobs."""
    if status.phase == "down":
        options = up_options(status.config, up_flags) if status.config is not None else []
        _render_down(status, console, options)
        return
    width = console.width
    wide = width >= STATUS_WIDE_COLUMNS
    colour = "green" if status.healthy else "red"
    verdict = "healthy" if status.healthy else "not healthy"
    console.print(f"lab in {status.run_dir}: [bold]{status.phase}[/], [{colour}]{verdict}[/]")
    if status.error:
        console.print(f"[red]last error:[/] {escape(status.error)}")
    if status.target_file is not None:
        console.print(f"target file: {escape(str(status.target_file))}")
    columns = [Col(header="node")]
    if wide:
        columns += [Col(header="netns"), Col(header="address")]
    columns += [Col(header="namespace"), Col(header="agent pid"), Col(header="agent")]
    columns.append(Col(header="health", flex=True))
    rows = []
    for node in status.nodes:
        cells = [escape(node.name)]
        if wide:
            cells += [escape(node.netns), str(node.address)]
        cells.append("[green]exists[/]" if node.netns_exists else "[red]missing[/]")
        agent = _service_cells(node.agent) if node.agent else ["-", "-", "-"]
        if node.agent and not node.agent.running:
            agent[1] = "[red]exited[/]"
        rows.append(cells + agent)
    console.print(one_line_table(columns, rows, width=width, title="Nodes"))
    columns = [Col(header="service"), Col(header="pid"), Col(header="process")]
    columns.append(Col(header="health", flex=True))
    if wide:
        columns.append(Col(header="url", flex=True))
    rows = []
    for service in status.services:
        cells = [escape(service.name), *_service_cells(service)]
        rows.append([*cells, escape(service.url)] if wide else cells)
    console.print(one_line_table(columns, rows, width=width, title="Services"))
    if status.slurm is not None:
        _render_slurm(status.slurm, console)
    _render_jobs(status.jobs, console)


def up_options(config: LabConfig, flags: Iterable[tuple[str, str, Any, str]]) -> list[str]:
    """The options among ``flags`` (``lab up``'s: flag, LabConfig field, type, help) that
    give ``config``: those of its settings that are not the defaults."""
    defaults = LabConfig()
    options: list[str] = []
    for flag, field, kind, _ in flags:
        value = getattr(config, field)
        if value == getattr(defaults, field):
            continue
        if kind is bool:
            on, off = flag.split("/")
            options.append(on if value else off)
        else:
            options += [flag, str(value)]
    return options


def _render_down(status: LabStatus, console: Console, up_options: list[str]) -> None:
    """A stopped lab: that it is not running and how to start it, its last error, and the
    jobs it ran (no nodes or services table: nothing of them is left to show)."""
    run_dir = escape(str(status.run_dir))
    command = shlex.join(["stormwatch", "lab", "up", "--run-dir", str(status.run_dir), *up_options])
    console.print(
        f"lab in {run_dir}: [bold]down[/], not running; start it with `{escape(command)}`",
        soft_wrap=True,  # one line, the command copy-pastable
    )
    if status.error:
        console.print(f"[red]last error:[/] {escape(status.error)}")
    _render_jobs(status.jobs, console)


def _render_jobs(jobs: list[JobStatus], console: Console) -> None:
    """The jobs table (nothing when there is no job) and each stranded job's problem."""
    if not jobs:
        return
    width = console.width
    wide = width >= STATUS_WIDE_COLUMNS
    now = time.time()
    columns = [Col(header="job", flex=True, min_width=12), Col(header="state")]
    columns.append(Col(header="exit codes", flex=True, min_width=16))
    columns.append(Col(header="folder", flex=True) if wide else Col(header="age"))
    rows = []
    for job in jobs:
        state = "running" if job.running else ("stopped" if job.stopped else "ended")
        codes = ", ".join(
            f"{n}={'running' if c is None and job.running else c}"
            for n, c in job.exit_codes.items()
        )
        last = escape(str(job.job_dir)) if wide else short_age(now - job.started_at)
        rows.append([escape(job.name), state, escape(codes), last])
    console.print(one_line_table(columns, rows, width=width, title="Jobs"))
    for job in jobs:
        if job.problem:
            console.print(f"[red]job {escape(job.name)}:[/] {escape(job.problem)}")


def _render_slurm(slurm: SlurmStatus, console: Console) -> None:
    """One line for the controller, one per node (with its drain or down reason)."""
    colour = "green" if slurm.healthy else "red"
    detail = f": {escape(slurm.detail)}" if slurm.detail else ""
    console.print(
        f"Slurm: slurmctld {slurm.controller} [{colour}]{'in service' if slurm.healthy else 'not healthy'}[/]{detail}"
    )
    rows = [
        [escape(node), escape(state), escape(slurm.reasons.get(node, ""))]
        for node, state in slurm.nodes.items()
    ]
    columns = [Col(header="slurm node"), Col(header="state"), Col(header="reason", flex=True)]
    console.print(one_line_table(columns, rows, width=console.width, title="Slurm nodes"))


__all__ = [
    "STATUS_WIDE_COLUMNS",
    "JobStatus",
    "LabStatus",
    "NodeStatus",
    "ServiceStatus",
    "SlurmStatus",
    "collect_status",
    "render_status",
    "slurm_status",
]
