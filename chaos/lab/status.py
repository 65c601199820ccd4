"""What ``lab status`` reports: nodes, services and jobs, with live health probes."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel

from stormwatch.chaos.lab import health, jobs, procs
from stormwatch.chaos.lab.netns import NetworkLayer
from stormwatch.chaos.lab.state import LabState, Phase


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


class LabStatus(BaseModel):
    """The whole lab; ``healthy`` is true when it is up and every check passed."""

    run_dir: Path
    phase: Phase
    healthy: bool
    prometheus_url: str
    alertmanager_url: str
    responder_url: str
    nodes: list[NodeStatus]
    services: list[ServiceStatus]
    jobs: list[JobStatus]
    error: str | None = None


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
        result = jobs.result(record)
        running = jobs.is_running(record)
        job_list.append(
            JobStatus(
                name=name,
                running=running,
                problem=jobs.stranded(record) if running else None,
                stopped=record.stopped,
                started_at=record.info.started_at,
                exit_codes=result.exit_codes,
                job_dir=record.info.job_dir,
            )
        )
    healthy = (
        state.phase == "up"
        and all(n.netns_exists for n in nodes)
        and bool(services)
        and all(s.running and s.healthy for s in services.values())
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
        error=state.error,
    )


__all__ = ["JobStatus", "LabStatus", "NodeStatus", "ServiceStatus", "collect_status"]
