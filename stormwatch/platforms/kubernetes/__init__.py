"""The Kubernetes platform, through the official ``kubernetes`` Python client.

* :mod:`.api`: the seam (:class:`KubeApi`: the eleven API operations used),
  :class:`ClientKubeApi` on the official client, each operation's RBAC need
  (:data:`ACCESS`, :data:`RESPONDER_ACCESS`), :func:`api_error`;
* :mod:`.recorded`: :class:`RecordedKubeApi`, the same interface answered from
  recorded API bodies (tests; no cluster needed);
* :mod:`.workers`: a job's workload (Job, indexed Job, JobSet, pods by label), its
  pods' ranks, :func:`start_job` / :func:`find_workload` (start or attach);
* :mod:`.agents`: :func:`discover_agents`, the node agents (pods of the agent DaemonSet);
* :mod:`.backend`: :class:`KubernetesBackend`, the :class:`~stormwatch.platforms.PlatformBackend`.

Errors: :class:`~stormwatch.platforms.errors.BackendError` (what was refused, what was seen).
"""

from __future__ import annotations

from stormwatch.platforms.kubernetes.agents import (
    AGENT_NAMESPACE,
    AGENT_SELECTOR,
    AgentEndpoint,
    discover_agents,
)
from stormwatch.platforms.kubernetes.api import (
    ACCESS,
    LAUNCHER_ACCESS,
    RESPONDER_ACCESS,
    Access,
    ClientKubeApi,
    KubeApi,
    api_error,
    rbac_rules,
)
from stormwatch.platforms.kubernetes.backend import KubernetesBackend
from stormwatch.platforms.kubernetes.recorded import RecordedKubeApi
from stormwatch.platforms.kubernetes.workers import (
    COMPLETION_INDEX,
    JOB_GLOBAL_INDEX,
    JOBSET_NAME,
    PodRanks,
    Workload,
    WorkloadKind,
    find_workload,
    pod_ranks,
    start_job,
)

__all__ = [
    "ACCESS",
    "AGENT_NAMESPACE",
    "AGENT_SELECTOR",
    "COMPLETION_INDEX",
    "JOBSET_NAME",
    "JOB_GLOBAL_INDEX",
    "LAUNCHER_ACCESS",
    "RESPONDER_ACCESS",
    "Access",
    "AgentEndpoint",
    "ClientKubeApi",
    "KubeApi",
    "KubernetesBackend",
    "PodRanks",
    "RecordedKubeApi",
    "Workload",
    "WorkloadKind",
    "api_error",
    "discover_agents",
    "find_workload",
    "pod_ranks",
    "rbac_rules",
    "start_job",
]
