"""A training job's workers on Kubernetes: which workload, which pods, which ranks.

A job is one of (:class:`Workload`):

* a **Job** (``batch/v1``), indexed or not: its pods are the ones its own
  ``spec.selector`` matches; an indexed Job's completion index (label or annotation
  ``batch.kubernetes.io/job-completion-index``) is the pod's node rank;
* a **JobSet** (``jobset.x-k8s.io/v1alpha2``): pods labelled
  ``jobset.sigs.k8s.io/jobset-name=<name>``; node rank =
  ``job-global-index * pods_per_job + completion index``, ``pods_per_job`` being the
  replicated Jobs' ``parallelism`` (they must agree);
* **pods by label** (``<job_label>=<name>``, the backend's ``job_label``), for
  workloads of any other kind.

Without a completion index the node rank is a literal ``PET_NODE_RANK`` in the first
container's environment (a single-pod Job: 0). Ranks per pod: a literal
``PET_NPROC_PER_NODE`` (torchrun reads its options from ``PET_*``), default 1; the
pod runs global ranks ``node_rank * nproc .. node_rank * nproc + nproc - 1``
(torchrun's assignment).

:func:`start_job` creates a Job or JobSet from a manifest (checked first,
:mod:`.manifests`); :func:`find_workload` attaches to a running one by name;
:func:`read_outcome` says how it ended (its status conditions); :func:`delete_workload`
deletes one this run started.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.kubernetes.api import KubeApi, api_error, refusal
from stormwatch.platforms.kubernetes.manifests import check_manifest

#: Label and annotation where the Job controller puts an indexed Job pod's index.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: Label the JobSet controller puts on its pods: the JobSet's name.
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
#: Label/annotation of a JobSet pod: its child Job's index over all replicated Jobs.
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
#: Pods that are not workers any more.
DONE_PHASES = frozenset({"Succeeded", "Failed"})

WorkloadKind = Literal["auto", "Job", "JobSet", "label"]


@dataclass(frozen=True)
class PodRanks:
    """One worker pod: its name, node (None while unscheduled) and global ranks."""

    name: str
    node: str | None
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Workload:
    """What runs a job: its ``kind`` (Job, JobSet, or pods by ``label``), ``name``,
    ``namespace``, the label ``selector`` of its pods, and for a JobSet the pods per
    child Job (node-rank arithmetic, module docstring)."""

    kind: Literal["Job", "JobSet", "label"]
    name: str
    namespace: str
    selector: str
    pods_per_job: int = 1

    def describe(self) -> str:
        """``Job llm in namespace training`` / ``pods labelled k=v in namespace training``."""
        if self.kind == "label":
            return f"pods labelled {self.selector} in namespace {self.namespace}"
        return f"{self.kind} {self.name} in namespace {self.namespace}"


def _meta_value(pod: k8s.V1Pod, key: str) -> str | None:
    meta = pod.metadata or k8s.V1ObjectMeta()
    return (meta.labels or {}).get(key) or (meta.annotations or {}).get(key)


def _env_literal(pod: k8s.V1Pod, name: str) -> str | None:
    containers = pod.spec.containers if pod.spec else []
    for container in containers[:1]:
        for var in container.env or []:
            if var.name == name and var.value is not None:
                return str(var.value)
    return None


def pod_ranks(pod: k8s.V1Pod, *, pods_per_job: int = 1) -> PodRanks:
    """The ranks ``pod`` runs (module docstring).

    Raises:
        BackendError: the pod has neither a completion index nor ``PET_NODE_RANK``,
            or one of them (or ``PET_NPROC_PER_NODE``, the global index) is not an integer.
    """
    name = (pod.metadata.name if pod.metadata else None) or "?"
    raw = _meta_value(pod, COMPLETION_INDEX) or _env_literal(pod, "PET_NODE_RANK")
    nproc_raw = _env_literal(pod, "PET_NPROC_PER_NODE") or "1"
    global_raw = _meta_value(pod, JOB_GLOBAL_INDEX) or "0"
    if raw is None:
        raise BackendError(
            f"pod {name}: no node rank (neither the {COMPLETION_INDEX} label of an indexed "
            "Job nor a PET_NODE_RANK value)"
        )
    try:
        index, nproc, job_index = int(raw), int(nproc_raw), int(global_raw)
    except ValueError as exc:
        raise BackendError(
            f"pod {name}: node rank {raw!r} / PET_NPROC_PER_NODE {nproc_raw!r} / "
            f"{JOB_GLOBAL_INDEX} {global_raw!r} not integers"
        ) from exc
    node_rank = job_index * pods_per_job + index
    node = pod.spec.node_name if pod.spec else None
    return PodRanks(name, node, tuple(range(node_rank * nproc, (node_rank + 1) * nproc)))


def is_live(pod: k8s.V1Pod) -> bool:
    """Not finished and not being deleted."""
    done = pod.status is not None and pod.status.phase in DONE_PHASES
    deleting = pod.metadata is not None and pod.metadata.deletion_timestamp is not None
    return not done and not deleting


def _job_workload(job: k8s.V1Job, name: str, namespace: str) -> Workload:
    labels = (job.spec.selector.match_labels if job.spec and job.spec.selector else None) or {
        "batch.kubernetes.io/job-name": name
    }
    selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
    return Workload("Job", name, namespace, selector)


def _jobset_workload(jobset: Mapping[str, Any], name: str, namespace: str) -> Workload:
    replicated = (jobset.get("spec") or {}).get("replicatedJobs") or []
    sizes = {
        int(((r.get("template") or {}).get("spec") or {}).get("parallelism") or 1)
        for r in replicated
    }
    if len(sizes) > 1:
        raise BackendError(
            f"JobSet {namespace}/{name}: replicated Jobs of different parallelism "
            f"({sorted(sizes)}); the node rank of a pod is ambiguous"
        )
    return Workload("JobSet", name, namespace, f"{JOBSET_NAME}={name}", sizes.pop() if sizes else 1)


def find_workload(
    api: KubeApi, name: str, namespace: str, *, kind: WorkloadKind = "auto", job_label: str
) -> Workload:
    """The workload running job ``name``: ``kind`` pins it; ``auto`` tries a Job of that
    name, then a JobSet, then pods labelled ``job_label=name``.

    Raises:
        BackendError: a pinned Job/JobSet does not exist, or the API refused (403 names
            the RBAC grant).
    """
    label = Workload("label", name, namespace, f"{job_label}={name}")
    if kind == "label":
        return label
    if kind in ("auto", "Job"):
        try:
            return _job_workload(api.read_job(name, namespace), name, namespace)
        except ApiException as exc:
            if refusal(exc) != "not_found" or kind == "Job":
                what = f"reading Job {namespace}/{name}"
                raise api_error(what, "read_job", exc, namespace=namespace) from exc
    try:
        return _jobset_workload(api.read_jobset(name, namespace), name, namespace)
    except ApiException as exc:
        if refusal(exc) != "not_found" or kind == "JobSet":
            what = f"reading JobSet {namespace}/{name}"
            raise api_error(what, "read_jobset", exc, namespace=namespace) from exc
    return label


def start_job(api: KubeApi, namespace: str, manifest: Mapping[str, Any]) -> Workload:
    """Create the Job or JobSet of ``manifest`` in ``namespace``; its :class:`Workload`.

    The manifest is checked first (:func:`~.manifests.check_manifest`): nothing is sent
    when it is not valid.

    Raises:
        InvalidManifest: not a valid Job or JobSet (names the field).
        BackendError: the API refused (409 when a job of that name exists: attach to it
            instead; 403 names the RBAC grant).
    """
    checked = check_manifest(manifest)
    name = checked.name
    if checked.kind == "Job":
        body = k8s.V1Job.model_validate(checked.body)
        try:
            made = api.create_job(namespace, body)
        except ApiException as exc:
            what = f"creating Job {namespace}/{name}"
            raise api_error(what, "create_job", exc, namespace=namespace) from exc
        return _job_workload(made, name, namespace)
    try:
        made_set = api.create_jobset(namespace, checked.body)
    except ApiException as exc:
        what = f"creating JobSet {namespace}/{name}"
        raise api_error(what, "create_jobset", exc, namespace=namespace) from exc
    return _jobset_workload(made_set, name, namespace)


#: The terminal conditions (type -> succeeded) of a Job (batch/v1 ``JobConditionType``)
#: and of a JobSet (jobset.x-k8s.io ``JobSetConditionType``).
_TERMINAL = {
    "Job": {"Complete": True, "Failed": False},
    "JobSet": {"Completed": True, "Failed": False},
}


def _outcome(kind: str, conditions: list[Any]) -> bool | None:
    for condition in conditions:
        if isinstance(condition, Mapping):
            kind_of, status = condition.get("type"), condition.get("status")
        else:
            kind_of, status = condition.type, condition.status
        if status == "True" and kind_of in _TERMINAL[kind]:
            return _TERMINAL[kind][kind_of]
    return None


def read_outcome(api: KubeApi, workload: Workload) -> bool | None:
    """How ``workload`` ended, from its status: True for a Job's ``Complete`` (a JobSet's
    ``Completed``) condition, False for ``Failed`` (an indexed Job whose indexes failed, a
    JobSet whose restarts ran out), None while it runs, and for pods by label (no status).

    Raises:
        BackendError: the API refused (404: the Job/JobSet is gone, e.g. deleted or
            removed by ``ttlSecondsAfterFinished``).
    """
    if workload.kind == "label":
        return None
    where = f"{workload.namespace}/{workload.name}"
    try:
        if workload.kind == "Job":
            job = api.read_job(workload.name, workload.namespace)
            return _outcome("Job", (job.status.conditions if job.status else None) or [])
        jobset = api.read_jobset(workload.name, workload.namespace)
    except ApiException as exc:
        operation = "read_job" if workload.kind == "Job" else "read_jobset"
        what = f"reading the status of {workload.kind} {where}"
        raise api_error(what, operation, exc, namespace=workload.namespace) from exc
    return _outcome("JobSet", (jobset.get("status") or {}).get("conditions") or [])


def delete_workload(api: KubeApi, workload: Workload, *, grace_period_s: int) -> None:
    """Delete ``workload`` and, by background propagation, its child Jobs and pods (the
    API's default for a Job through its REST path is to orphan the pods: never that).
    Gone already is not an error.

    Raises:
        BackendError: a workload of pods by label (nothing owns them to delete), or the
            API refused (403 names the RBAC grant).
    """
    if workload.kind == "label":
        raise BackendError(f"cannot delete {workload.describe()}: no Job or JobSet owns them")
    body = k8s.V1DeleteOptions(grace_period_seconds=grace_period_s, propagation_policy="Background")
    operation = "delete_job" if workload.kind == "Job" else "delete_jobset"
    try:
        if workload.kind == "Job":
            api.delete_job(workload.name, workload.namespace, body)
        else:
            api.delete_jobset(workload.name, workload.namespace, body)
    except ApiException as exc:
        if refusal(exc) == "not_found":
            return
        what = f"deleting {workload.describe()}"
        raise api_error(what, operation, exc, namespace=workload.namespace) from exc


__all__ = [
    "COMPLETION_INDEX",
    "DONE_PHASES",
    "JOBSET_NAME",
    "JOB_GLOBAL_INDEX",
    "PodRanks",
    "Workload",
    "WorkloadKind",
    "delete_workload",
    "find_workload",
    "is_live",
    "pod_ranks",
    "read_outcome",
    "start_job",
]
