"""Where everything of one lab lives inside its run directory.

The run directory stands in for a cluster's shared filesystem: every process of
the lab (all namespaces share the filesystem) reads and writes under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    """Paths under one run directory (absolute; nothing is created here)."""

    run_dir: Path

    @classmethod
    def of(cls, run_dir: Path | str) -> RunPaths:
        """Paths of ``run_dir`` made absolute (processes run with other working dirs)."""
        return cls(Path(run_dir).expanduser().resolve())

    @property
    def lab_entries(self) -> frozenset[str]:
        """Names of everything the lab itself writes at the top of the run directory
        (``lab.json``, ``target.yaml``, the lock, the service and node folders, ...): what a
        tool may take for the lab's own before deleting a run directory."""
        tops = (
            self.state_file,
            self.target_file,
            self.lock_file,
            self.secrets_dir,
            self.logs_dir,
            self.node_dir("x").parent,
            self.prometheus_dir,
            self.grafana_dir,
            self.alertmanager_dir,
            self.responder_dir,
            self.slurm_dir,
            self.job_dir("x").parent,
        )
        return frozenset(path.relative_to(self.run_dir).parts[0] for path in tops)

    @property
    def state_file(self) -> Path:
        return self.run_dir / "lab.json"

    @property
    def target_file(self) -> Path:
        """The lab's target file (``lab up`` writes it; ``stormwatch chaos ... --target``)."""
        return self.run_dir / "target.yaml"

    @property
    def lock_file(self) -> Path:
        return self.run_dir / ".lab.lock"

    @property
    def secrets_dir(self) -> Path:
        return self.run_dir / "secrets"

    @property
    def agent_token(self) -> Path:
        return self.secrets_dir / "agent.token"

    @property
    def responder_token(self) -> Path:
        return self.secrets_dir / "responder.token"

    @property
    def logs_dir(self) -> Path:
        """Logs and supervisor status files of the lab's services."""
        return self.run_dir / "logs"

    def service_log(self, service: str) -> Path:
        return self.logs_dir / f"{service}.log"

    def service_status(self, service: str) -> Path:
        return self.logs_dir / f"{service}.status.json"

    def node_dir(self, node: str) -> Path:
        return self.run_dir / "nodes" / node

    def node_metrics(self, node: str) -> Path:
        """The node's prometheus-client multiprocess directory (``STORMWATCH_METRICS_DIR``)."""
        return self.node_dir(node) / "metrics"

    def node_state(self, node: str) -> Path:
        """The agent's own state directory (fault ledger and the like)."""
        return self.node_dir(node) / "agent"

    @property
    def prometheus_dir(self) -> Path:
        return self.run_dir / "prometheus"

    @property
    def prometheus_config(self) -> Path:
        return self.prometheus_dir / "prometheus.yml"

    @property
    def prometheus_inventory(self) -> Path:
        """The expected inventory, the lab's nodes (``stormwatch alerts config inventory``)."""
        return self.prometheus_dir / "inventory.yml"

    @property
    def prometheus_data(self) -> Path:
        return self.prometheus_dir / "data"

    @property
    def grafana_dir(self) -> Path:
        """Generated Grafana dashboards (``dashboards/``) and provisioning (``provisioning/``)."""
        return self.run_dir / "grafana"

    @property
    def alertmanager_dir(self) -> Path:
        return self.run_dir / "alertmanager"

    @property
    def alertmanager_config(self) -> Path:
        return self.alertmanager_dir / "alertmanager.yml"

    @property
    def alertmanager_data(self) -> Path:
        return self.alertmanager_dir / "data"

    @property
    def responder_dir(self) -> Path:
        return self.run_dir / "responder"

    @property
    def responder_db(self) -> Path:
        return self.responder_dir / "responder.sqlite"

    @property
    def responder_postmortems(self) -> Path:
        """The responder's incident post-mortems (``incident-<id>/`` folders)."""
        return self.responder_dir / "postmortems"

    @property
    def slurm_dir(self) -> Path:
        """The lab's Slurm cluster: configs, munge, controller and node state
        (laid out by :class:`stormwatch.lab.slurm.SlurmPaths`)."""
        return self.run_dir / "slurm"

    def job_dir(self, job: str) -> Path:
        return self.run_dir / "jobs" / job

    def job_logs(self, job: str) -> Path:
        """Per-rank JSON-lines logs (``rank<R>.jsonl``)."""
        return self.job_dir(job) / "logs"

    def job_checkpoints(self, job: str) -> Path:
        return self.job_dir(job) / "checkpoints"

    def job_node_log(self, job: str, node: str) -> Path:
        """torchrun's own output on one node (``<node>.torchrun.log``)."""
        return self.job_dir(job) / f"{node}.torchrun.log"

    def job_node_status(self, job: str, node: str) -> Path:
        return self.job_dir(job) / f"{node}.status.json"


__all__ = ["RunPaths"]
