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

:func:`start_job` creates a Job or JobSet from a manifest (validated against the
client's typed models first); :func:`find_workload` attaches to a running one by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.kubernetes.api import (
    JOBSET_GROUP,
    JOBSET_VERSION,
    KubeApi,
    api_error,
    refusal,
)

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

    A Job is validated against the client's ``V1Job`` model first (unknown fields and
    wrong types fail, naming the field); a JobSet needs ``apiVersion``
    ``jobset.x-k8s.io/v1alpha2``, a name and ``spec.replicatedJobs``.

    Raises:
        BackendError: another kind, an invalid manifest, or the API refused
            (409 when a job of that name exists: attach to it instead).
    """
    kind, name = manifest.get("kind"), (manifest.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise BackendError("job manifest: metadata.name is missing")
    if kind == "Job":
        try:
            body = k8s.V1Job.model_validate(dict(manifest))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)
            )
            raise BackendError(
                f"job manifest {name}: not a valid batch/v1 Job: {problems}"
            ) from exc
        try:
            made = api.create_job(namespace, body)
        except ApiException as exc:
            what = f"creating Job {namespace}/{name}"
            raise api_error(what, "create_job", exc, namespace=namespace) from exc
        return _job_workload(made, name, namespace)
    if kind == "JobSet":
        if manifest.get("apiVersion") != f"{JOBSET_GROUP}/{JOBSET_VERSION}" or not (
            (manifest.get("spec") or {}).get("replicatedJobs")
        ):
            raise BackendError(
                f"job manifest {name}: a JobSet needs apiVersion {JOBSET_GROUP}/{JOBSET_VERSION} "
                "and spec.replicatedJobs"
            )
        try:
            made_set = api.create_jobset(namespace, dict(manifest))
        except ApiException as exc:
            what = f"creating JobSet {namespace}/{name}"
            raise api_error(what, "create_jobset", exc, namespace=namespace) from exc
        return _jobset_workload(made_set, name, namespace)
    raise BackendError(f"job manifest {name}: kind {kind!r} is not Job or JobSet")


__all__ = [
    "COMPLETION_INDEX",
    "DONE_PHASES",
    "JOBSET_NAME",
    "JOB_GLOBAL_INDEX",
    "PodRanks",
    "Workload",
    "WorkloadKind",
    "find_workload",
    "is_live",
    "pod_ranks",
    "start_job",
]
