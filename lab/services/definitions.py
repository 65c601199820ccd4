"""The lab's services: their command lines, configuration files and health URLs.

Prometheus and Alertmanager are the Debian binaries (``prometheus``,
``prometheus-alertmanager``); the agents and the responder are other
components' CLIs (``stormwatch agent run``, ``stormwatch alerts serve``), and
the rules folder and the Alertmanager configuration come from
``stormwatch alerts`` as docs/ARCHITECTURE.md specifies.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stormwatch.contracts import inventory
from stormwatch.dashboards import render as dashboards
from stormwatch.lab.config import LabConfig
from stormwatch.lab.errors import LabError
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import LabState, NodeState

#: Prometheus scrape job of the agents (the ``job`` label of their series).
AGENT_SCRAPE_JOB = "stormwatch-agent"
PROMETHEUS_BINARY = "prometheus"
ALERTMANAGER_BINARY = "prometheus-alertmanager"
PROMTOOL_BINARY = "promtool"
#: Prometheus' ``--rules.alert.for-grace-period``: no longer than the shortest ``for`` of the
#: shipped rules (StormwatchTrainingHung, 30 s), so that after a Prometheus restart every
#: pending or firing alert has its ``for`` state restored from ``ALERTS_FOR_STATE``
#: (Prometheus skips alerts whose ``for`` is shorter than the grace period: they start
#: pending again); the default 10 m restores none of ours. docs/runbooks.md, "Prometheus
#: restarts".
ALERT_FOR_GRACE_PERIOD = "30s"


@dataclass(frozen=True)
class ServiceSpec:
    """How to start one service and how to tell it is healthy.

    Attributes:
        name: key in :attr:`LabState.processes` (``agent-node0``, ``prometheus`` ...).
        cmd: command line.
        health_url: answers 2xx once the service is ready.
        netns: network namespace to run in (``None``: root namespace).
    """

    name: str
    cmd: tuple[str, ...]
    health_url: str
    netns: str | None = None


def find_binary(name: str, package: str) -> str:
    """Absolute path of ``name`` on ``PATH``; :class:`LabError` naming the package when missing."""
    found = shutil.which(name)
    if found is None:
        raise LabError(f"`{name}` is not installed (apt-get install {package})")
    return found


def stormwatch_command() -> tuple[str, ...]:
    """The ``stormwatch`` console script of this installation (next to the interpreter)."""
    script = Path(sys.executable).with_name("stormwatch")
    if script.exists():
        return (str(script),)
    found = shutil.which("stormwatch")
    if found is None:
        raise LabError("the `stormwatch` console script is not installed next to this Python")
    return (found,)


def go_duration(seconds: float) -> str:
    """Seconds as a Prometheus/Alertmanager duration (``1s``, ``500ms``)."""
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def _alerts_cli(*args: str) -> str:
    cmd = [*stormwatch_command(), "alerts", *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"`{' '.join(cmd)}` failed: {exc}") from exc
    if out.returncode != 0:
        detail = (out.stderr.strip() or out.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise LabError(
            f"`stormwatch alerts {' '.join(args)}` failed (exit {out.returncode}): {detail[0]}"
        )
    return out.stdout


def rules_dir() -> Path:
    """The shipped alert rules folder (``stormwatch alerts rules-path``)."""
    path = Path(_alerts_cli("rules-path").strip())
    if not path.is_dir():
        raise LabError(f"`stormwatch alerts rules-path` names {path}, which is not a folder")
    return path


def prometheus_config(
    state: LabState, rules: Path | None, inventory: Path | None = None
) -> dict[str, Any]:
    """The lab's ``prometheus.yml`` as data.

    Scrapes every agent (one static target per node, labelled ``node``; the series name
    their training job in ``training_job``, so ``job`` is the scrape job's and needs no
    ``honor_labels``) and Prometheus itself every ``scrape_interval``; evaluates ``rules/*.yml`` and the
    expected inventory ``inventory`` (:func:`write_inventory`); sends alerts to the
    lab's Alertmanager.
    """
    config = state.config
    interval = go_duration(config.scrape_interval)
    rule_files = [str(rules / "*.yml")] if rules is not None else []
    if inventory is not None:
        rule_files.append(str(inventory))
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "rule_files": rule_files,
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{config.alertmanager_port}"]}]}
            ]
        },
        "scrape_configs": [
            {
                "job_name": AGENT_SCRAPE_JOB,
                "static_configs": [
                    {
                        "targets": [f"{node.address}:{config.agent_port}"],
                        "labels": {"node": node.name},
                    }
                    for node in state.nodes
                ],
            },
            {
                "job_name": "prometheus",
                "static_configs": [{"targets": [f"127.0.0.1:{config.prometheus_port}"]}],
            },
        ],
    }


def write_prometheus_config(
    state: LabState, paths: RunPaths, rules: Path | None, inventory: Path | None = None
) -> Path:
    """Write ``<run>/prometheus/prometheus.yml`` and return its path."""
    paths.prometheus_dir.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(prometheus_config(state, rules, inventory), sort_keys=False)
    paths.prometheus_config.write_text(text)
    return paths.prometheus_config


def write_inventory(state: LabState, paths: RunPaths) -> Path:
    """Write the expected inventory, every node of the lab, to
    ``<run>/prometheus/inventory.yml`` (:mod:`stormwatch.contracts.inventory`, what
    ``stormwatch alerts config inventory`` writes): the rules of ``targets.yml`` alert for
    a node whose agent is not a target, however long.

    Raises:
        ConfigError: the file cannot be written.
    """
    paths.prometheus_dir.mkdir(parents=True, exist_ok=True)
    nodes = [node.name for node in state.nodes]
    return inventory.write_inventory(nodes, paths.prometheus_inventory)


def write_grafana_files(state: LabState, paths: RunPaths) -> Path:
    """Write the dashboards and Grafana provisioning for the lab's Prometheus.

    ``<run>/grafana/dashboards/<uid>.json`` and ``<run>/grafana/provisioning/
    {dashboards,datasources}/stormwatch.yaml`` (data source URL
    :attr:`LabState.prometheus_url`), via :func:`stormwatch.dashboards.write`.

    Returns:
        The ``grafana`` folder.

    Raises:
        ConfigError: the folder cannot be written.
    """
    # The lab's fast value over the production default: its 1 s scrape interval.
    dashboards.write(
        paths.grafana_dir,
        state.prometheus_url,
        scrape_interval=go_duration(state.config.scrape_interval),
    )
    return paths.grafana_dir


def grafana_hint(grafana_dir: Path) -> str:
    """One line telling how to point a Grafana at the files :func:`write_grafana_files` wrote."""
    provisioning = grafana_dir / "provisioning"
    return (
        f"Grafana: dashboards + provisioning in {grafana_dir}; run Grafana with "
        f"GF_PATHS_PROVISIONING={provisioning} (e.g. `GF_PATHS_PROVISIONING={provisioning} "
        "grafana-server --homepath /usr/share/grafana`) and open the Stormwatch folder"
    )


def check_prometheus_config(path: Path) -> None:
    """Run ``promtool check config`` (rules included); :class:`LabError` with its output if it fails."""
    promtool = shutil.which(PROMTOOL_BINARY)
    if promtool is None:
        return  # promtool ships with the prometheus package; without it, Prometheus reports
    out = subprocess.run(
        [promtool, "check", "config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if out.returncode != 0:
        raise LabError(f"generated {path} fails `promtool check config`:\n{out.stdout}{out.stderr}")


def write_alertmanager_config(state: LabState, paths: RunPaths) -> Path:
    """Generate ``alertmanager.yml`` with ``stormwatch alerts config alertmanager``.

    Group wait and interval come from the lab's configuration (short, so chaos
    experiments see notifications within seconds).
    """
    paths.alertmanager_dir.mkdir(parents=True, exist_ok=True)
    _alerts_cli(
        "config",
        "alertmanager",
        "--responder-url",
        state.responder_url,
        "--token-file",
        str(state.responder_token_file),
        "--group-wait",
        go_duration(state.config.alert_group_wait),
        "--group-interval",
        go_duration(state.config.alert_group_interval),
        "--output",
        str(paths.alertmanager_config),
    )
    if not paths.alertmanager_config.is_file():
        raise LabError("`stormwatch alerts config alertmanager` wrote no file")
    return paths.alertmanager_config


def agent_spec(config: LabConfig, node: NodeState, state: LabState, paths: RunPaths) -> ServiceSpec:
    """The agent of ``node``, inside its namespace, with a simulated GPU per rank."""
    sim_gpus = config.sim_gpus if config.sim_gpus is not None else config.nproc_per_node
    cmd = (
        *stormwatch_command(),
        "agent",
        "run",
        "--listen",
        f"0.0.0.0:{config.agent_port}",
        "--node",
        node.name,
        "--metrics-dir",
        str(node.metrics_dir),
        "--gpu-backend",
        "sim",
        "--sim-gpus",
        str(sim_gpus),
        "--token-file",
        str(state.agent_token_file),
        "--fault-api-listen",
        f"0.0.0.0:{config.agent_fault_port}",
        "--state-dir",
        str(paths.node_state(node.name)),
        # The lab's agents share the host's PID namespace: without this each would
        # claim every other job's ranks that name no metrics dir.
        "--no-claim-unlabelled-ranks",
    )
    return ServiceSpec(
        name=f"agent-{node.name}",
        cmd=cmd,
        health_url=f"{node.agent_url}/healthz",
        netns=node.netns,
    )


def prometheus_spec(config: LabConfig, state: LabState, paths: RunPaths) -> ServiceSpec:
    cmd = (
        find_binary(PROMETHEUS_BINARY, "prometheus"),
        f"--config.file={paths.prometheus_config}",
        f"--storage.tsdb.path={paths.prometheus_data}",
        f"--web.listen-address=127.0.0.1:{config.prometheus_port}",
        "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=2d",
        f"--rules.alert.for-grace-period={ALERT_FOR_GRACE_PERIOD}",
    )
    return ServiceSpec("prometheus", cmd, f"{state.prometheus_url}/-/ready")


def alertmanager_spec(config: LabConfig, state: LabState, paths: RunPaths) -> ServiceSpec:
    cmd = (
        find_binary(ALERTMANAGER_BINARY, "prometheus-alertmanager"),
        f"--config.file={paths.alertmanager_config}",
        f"--storage.path={paths.alertmanager_data}",
        f"--web.listen-address=127.0.0.1:{config.alertmanager_port}",
        "--cluster.listen-address=",
    )
    return ServiceSpec("alertmanager", cmd, f"{state.alertmanager_url}/-/ready")


def lab_policy_path() -> Path:
    """The lab's runbook policy for the responder it starts (``responder-policy.yml`` beside
    this module; the format is :class:`stormwatch.alerts.policy.Policy`): the responder's
    default plus ``StormwatchTrainingHung`` -> ``restart_workers``. Shipped with the lab,
    which deploys the responder, as the Prometheus configuration is."""
    return Path(__file__).with_name("responder-policy.yml")


def responder_spec(config: LabConfig, state: LabState, paths: RunPaths) -> ServiceSpec:
    """The responder: runbook policy ``<run>/responder/policy.yml`` when present, else the
    lab's (:func:`lab_policy_path`); its platform, Prometheus and the lab's run directory
    from the lab's target file (``--target <run>/target.yaml``, written before the
    services start, :mod:`stormwatch.lab.target_file`): on the Slurm lab its backend acts
    through Slurm (the lab's ``slurm.conf``), with the direct scheduler on the lab's
    processes; post-mortems go to ``<run>/responder/postmortems``."""
    own_policy = paths.responder_dir / "policy.yml"
    cmd = (
        *stormwatch_command(),
        "alerts",
        "serve",
        "--listen",
        f"127.0.0.1:{config.responder_port}",
        "--db",
        str(paths.responder_db),
        "--token-file",
        str(state.responder_token_file),
        "--policy",
        str(own_policy if own_policy.is_file() else lab_policy_path()),
        "--target",
        str(paths.target_file),
        "--postmortem-dir",
        str(paths.responder_postmortems),
    )
    return ServiceSpec("responder", cmd, f"{state.responder_url}/healthz")


#: The services in the root namespace, besides one ``agent-<node>`` per node.
ROOT_SERVICES = ("prometheus", "alertmanager", "responder")


def service_specs(state: LabState, paths: RunPaths) -> list[ServiceSpec]:
    """Every service of the lab, in start order: the agents, then :data:`ROOT_SERVICES`."""
    config = state.config
    specs = [agent_spec(config, node, state, paths) for node in state.nodes]
    specs += [
        prometheus_spec(config, state, paths),
        alertmanager_spec(config, state, paths),
        responder_spec(config, state, paths),
    ]
    return specs


__all__ = [
    "AGENT_SCRAPE_JOB",
    "ALERT_FOR_GRACE_PERIOD",
    "ROOT_SERVICES",
    "ServiceSpec",
    "agent_spec",
    "alertmanager_spec",
    "check_prometheus_config",
    "find_binary",
    "go_duration",
    "grafana_hint",
    "lab_policy_path",
    "prometheus_config",
    "prometheus_spec",
    "responder_spec",
    "rules_dir",
    "service_specs",
    "stormwatch_command",
    "write_alertmanager_config",
    "write_grafana_files",
    "write_inventory",
    "write_prometheus_config",
]
