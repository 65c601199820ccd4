"""Where a node's agent is: :class:`AgentEndpoint`, the one home of that record.

Every platform says it in the same shape: the lab from its nodes (``lab.json``), a Slurm
target from the job's nodes and the target file's ``agents:`` section, a Kubernetes
target from the Ready pods of the agent DaemonSet
(:func:`~stormwatch.platforms.kubernetes.discover_agents`). The chaos controller reads
``url`` (the read-only listener: ``/healthz``, ``/v1/ranks``) and ``fault_api``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class AgentEndpoint:
    """One node's agent.

    Attributes:
        node: the node's name as the platform names it (lab node, Slurm node,
            Kubernetes node).
        url: base URL of the agent's read-only listener (``--listen``), e.g.
            ``http://10.244.2.5:9400``.
        fault_url: base URL of its fault API listener (``--fault-api-listen``);
            None: the same as ``url``.
        pod: Kubernetes only, the agent's pod as ``<namespace>/<name>``; None elsewhere.
    """

    node: str
    url: str
    fault_url: str | None = None
    pod: str | None = None

    @property
    def fault_api(self) -> str:
        """Base URL for ``/v1/faults``: ``fault_url``, else ``url``."""
        return self.fault_url or self.url

    @classmethod
    def on_host(
        cls,
        node: str,
        host: str,
        *,
        port: int,
        fault_port: int | None = None,
        scheme: str = "http",
        pod: str | None = None,
    ) -> AgentEndpoint:
        """The agent of ``node`` listening on ``host`` (name or IP): ``<scheme>://<host>:<port>``,
        its fault API on ``fault_port`` of the same host (None: on ``port``)."""
        fault = f"{scheme}://{host}:{fault_port}" if fault_port else None
        return cls(node=node, url=f"{scheme}://{host}:{port}", fault_url=fault, pod=pod)


__all__ = ["AgentEndpoint"]
