"""The Kubernetes platform, through the official ``kubernetes`` Python client.

* :mod:`.api`: the seam (:class:`KubeApi`: the fourteen API operations used),
  :class:`ClientKubeApi` on the official client, each operation's RBAC need
  (:data:`ACCESS`; :data:`RESPONDER_ACCESS`, :data:`TARGET_ACCESS` and
  :data:`LAUNCHER_ACCESS` for the responder and the chaos controller), :func:`api_error`;
* :mod:`.recorded`: :class:`RecordedKubeApi`, the same interface answered from
  recorded API bodies (tests; no cluster needed);
* :mod:`.manifests`: a Job or JobSet manifest checked before it is sent
  (:func:`check_manifest`), and made from a target file's template (:func:`render_template`);
* :mod:`.workers`: a job's workload (Job, indexed Job, JobSet, pods by label), its
  pods' ranks, :func:`start_job` / :func:`find_workload` (start or attach),
  :func:`read_outcome` (how it ended), :func:`delete_workload`;
* :mod:`.agents`: :func:`discover_agents`, the node agents (pods of the agent DaemonSet) as
  :class:`~stormwatch.platforms.AgentEndpoint`;
* :mod:`.target_checks`: what a ``kubernetes`` target file must satisfy (its template
  renders to a valid manifest), called when a target file is loaded;
* :mod:`.backend`: :class:`KubernetesBackend`, the :class:`~stormwatch.platforms.PlatformBackend`.

Errors: :class:`~stormwatch.platforms.errors.BackendError` (what was refused, what was seen),
:class:`~stormwatch.platforms.errors.InvalidManifest` (a manifest is not valid; nothing sent).
"""

from __future__ import annotations

from stormwatch.platforms.kubernetes.agents import (
    AGENT_NAMESPACE,
    AGENT_SELECTOR,
    discover_agents,
)
from stormwatch.platforms.kubernetes.api import (
    ACCESS,
    LAUNCHER_ACCESS,
    RESPONDER_ACCESS,
    TARGET_ACCESS,
    Access,
    ClientKubeApi,
    KubeApi,
    api_error,
    rbac_rules,
)
from stormwatch.platforms.kubernetes.backend import KubernetesBackend
from stormwatch.platforms.kubernetes.manifests import (
    CHECK_VALUES,
    RUN_PARAMETERS,
    Manifest,
    check_manifest,
    render_template,
)
from stormwatch.platforms.kubernetes.recorded import RecordedKubeApi
from stormwatch.platforms.kubernetes.workers import (
    COMPLETION_INDEX,
    JOB_GLOBAL_INDEX,
    JOBSET_NAME,
    PodRanks,
    Workload,
    WorkloadKind,
    delete_workload,
    find_workload,
    pod_ranks,
    read_outcome,
    start_job,
)

__all__ = [
    "ACCESS",
    "AGENT_NAMESPACE",
    "AGENT_SELECTOR",
    "CHECK_VALUES",
    "COMPLETION_INDEX",
    "JOBSET_NAME",
    "JOB_GLOBAL_INDEX",
    "LAUNCHER_ACCESS",
    "RESPONDER_ACCESS",
    "RUN_PARAMETERS",
    "TARGET_ACCESS",
    "Access",
    "ClientKubeApi",
    "KubeApi",
    "KubernetesBackend",
    "Manifest",
    "PodRanks",
    "RecordedKubeApi",
    "Workload",
    "WorkloadKind",
    "api_error",
    "check_manifest",
    "delete_workload",
    "discover_agents",
    "find_workload",
    "pod_ranks",
    "rbac_rules",
    "read_outcome",
    "render_template",
    "start_job",
]
