"""The Kubernetes platform backend, through the official ``kubernetes`` Python client.

A job's workers are the pods labelled ``stormwatch.io/job=<job>`` (the label
the example training Job in deploy/kubernetes/ sets; :attr:`KubernetesBackend.job_label`)
in one namespace. Which pod runs which ranks comes from the pod itself:

* node rank: the indexed Job's completion index (label or annotation
  ``batch.kubernetes.io/job-completion-index``), else a literal ``PET_NODE_RANK``
  in the first container's environment;
* ranks per pod: a literal ``PET_NPROC_PER_NODE`` (torchrun reads its options from
  ``PET_*`` variables), default 1; global ranks are
  ``node_rank * nproc .. node_rank * nproc + nproc - 1`` (torchrun's assignment).

Actions (RBAC in deploy/kubernetes/base/responder.yaml):

* restart workers: delete the job's pods (``V1DeleteOptions``, background
  propagation); the Job controller recreates them and torchrun rendezvous again;
* exclude a node: cordon it (patch ``spec.unschedulable``), then evict the job's
  pods on it through the Eviction API (``V1Eviction``, honours PodDisruptionBudgets);
  the Job controller recreates them on other nodes. ``drain_node=True`` evicts every
  other pod on the node too (``kubectl drain`` semantics: DaemonSet and mirror pods
  stay), which needs cluster-wide pod list and eviction rights;
* checkpoint now: the trainer's control file, on a volume the responder shares with
  the job (:attr:`KubernetesBackend.control_dir`); without one it raises;
* collect diagnostics: each pod's phase, node, conditions and the tail of its log,
  written to ``<diagnostics_dir>/incident-<id>.json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from stormwatch.platforms.base import report_diagnostics, request_checkpoint_in
from stormwatch.platforms.errors import BackendError

#: Label and annotation where the Job controller puts an indexed Job pod's index.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: Pods that are not workers any more.
_DONE_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PodRanks:
    """One worker pod: its name, node (None while unscheduled) and global ranks."""

    name: str
    node: str | None
    ranks: tuple[int, ...]


def _name(pod: k8s.V1Pod) -> str:
    return (pod.metadata.name if pod.metadata else None) or ""


def _env_literal(pod: k8s.V1Pod, name: str) -> str | None:
    containers = pod.spec.containers if pod.spec else []
    for container in containers[:1]:
        for var in container.env or []:
            if var.name == name and var.value is not None:
                return str(var.value)
    return None


def pod_ranks(pod: k8s.V1Pod) -> PodRanks:
    """The ranks ``pod`` runs (module docstring).

    Raises:
        BackendError: the pod has neither a completion index nor ``PET_NODE_RANK``,
            or one of them (or ``PET_NPROC_PER_NODE``) is not an integer.
    """
    meta = pod.metadata or k8s.V1ObjectMeta()
    name = meta.name or "?"
    raw = (meta.labels or {}).get(COMPLETION_INDEX) or (meta.annotations or {}).get(
        COMPLETION_INDEX
    )
    raw = raw or _env_literal(pod, "PET_NODE_RANK")
    nproc_raw = _env_literal(pod, "PET_NPROC_PER_NODE") or "1"
    if raw is None:
        raise BackendError(
            f"pod {name}: no node rank (neither the {COMPLETION_INDEX} label of an indexed "
            "Job nor a PET_NODE_RANK value)"
        )
    try:
        node_rank, nproc = int(raw), int(nproc_raw)
    except ValueError as exc:
        raise BackendError(
            f"pod {name}: node rank {raw!r} / PET_NPROC_PER_NODE {nproc_raw!r} not integers"
        ) from exc
    node = pod.spec.node_name if pod.spec else None
    return PodRanks(name, node, tuple(range(node_rank * nproc, (node_rank + 1) * nproc)))


def _api_error(what: str, exc: ApiException) -> BackendError:
    return BackendError(f"kubernetes API: {what} failed: {exc.status} {exc.reason}".rstrip())


@dataclass(frozen=True, kw_only=True)
class KubernetesBackend:
    """The Kubernetes backend (module docstring).

    Attributes:
        core: the ``CoreV1Api`` to call (:meth:`connect` builds one from the
            in-cluster service account or the local kubeconfig).
        namespace: where the job's pods run.
        diagnostics_dir: where ``collect_diagnostics`` writes (created on demand).
        job_label: pod label whose value is the job name.
        control_dir: the trainer's control directory as the responder sees it (a
            shared volume); None: ``request_checkpoint`` raises.
        drain_node: ``exclude_node_and_restart`` also evicts the node's other pods.
        grace_period_s: termination grace period for deleted and evicted pods.
        log_tail_lines: log lines per pod in the diagnostics.
        clock: Unix time source (seconds).
    """

    core: k8s.CoreV1Api
    namespace: str
    diagnostics_dir: Path
    job_label: str = "stormwatch.io/job"
    control_dir: Path | None = None
    drain_node: bool = False
    grace_period_s: int = 30
    log_tail_lines: int = 200
    clock: Callable[[], float] = field(default=time.time)

    @classmethod
    def connect(cls, **settings: Any) -> KubernetesBackend:
        """A backend on the in-cluster configuration (service account), else ``~/.kube/config``.

        Raises:
            BackendError: neither configuration can be loaded.
        """
        from kubernetes import config as kube_config

        try:
            kube_config.load_incluster_config()
        except kube_config.ConfigException:
            try:
                kube_config.load_kube_config()
            except (kube_config.ConfigException, OSError) as exc:
                raise BackendError(
                    f"kubernetes: no in-cluster service account and no kubeconfig ({exc}); "
                    "run the responder in the cluster with its ServiceAccount "
                    "(deploy/kubernetes), or point KUBECONFIG at a kubeconfig file"
                ) from exc
        return cls(core=k8s.CoreV1Api(), **settings)

    def pods(self, job: str) -> list[k8s.V1Pod]:
        """The job's live pods (not finished, not being deleted), by name.

        Raises:
            BackendError: the API call failed.
        """
        try:
            listed = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{self.job_label}={job}"
            )
        except ApiException as exc:
            raise _api_error(f"listing the pods of job {job}", exc) from exc
        live = [
            p
            for p in listed.items or []
            if (p.status is None or p.status.phase not in _DONE_PHASES)
            and (p.metadata is None or p.metadata.deletion_timestamp is None)
        ]
        return sorted(live, key=_name)

    def _require(self, job: str) -> list[k8s.V1Pod]:
        pods = self.pods(job)
        if not pods:
            raise BackendError(
                f"no live worker of job {job!r} found (no pod labelled "
                f"{self.job_label}={job} in namespace {self.namespace})"
            )
        return pods

    def ranks(self, job: str) -> dict[int, str]:
        """Global rank -> node of the job's scheduled pods."""
        placement: dict[int, str] = {}
        for pod in self._require(job):
            found = pod_ranks(pod)
            if found.node is not None:
                placement.update(dict.fromkeys(found.ranks, found.node))
        return dict(sorted(placement.items()))

    def _delete_options(self) -> k8s.V1DeleteOptions:
        return k8s.V1DeleteOptions(
            grace_period_seconds=self.grace_period_s, propagation_policy="Background"
        )

    def _evict(self, name: str, namespace: str) -> None:
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=self._delete_options(),
        )
        try:
            self.core.create_namespaced_pod_eviction(name, namespace, body)
        except ApiException as exc:
            if exc.status == 404:  # gone already
                return
            raise _api_error(f"evicting pod {namespace}/{name}", exc) from exc

    def restart_workers(self, job: str) -> str:
        """Delete every pod of ``job``; the Job controller recreates them."""
        names = []
        for pod in self._require(job):
            name = _name(pod)
            try:
                self.core.delete_namespaced_pod(name, self.namespace, body=self._delete_options())
            except ApiException as exc:
                if exc.status != 404:
                    raise _api_error(f"deleting pod {self.namespace}/{name}", exc) from exc
            names.append(name)
        return f"deleted {len(names)} pods of job {job} ({', '.join(names)})"

    def cordon(self, node: str) -> None:
        """Mark ``node`` unschedulable (``kubectl cordon``).

        Raises:
            BackendError: the API call failed (e.g. no such node).
        """
        body = k8s.V1Node(spec=k8s.V1NodeSpec(unschedulable=True))
        try:
            self.core.patch_node(node, body)
        except ApiException as exc:
            raise _api_error(f"cordoning node {node}", exc) from exc

    def _other_pods_on(self, node: str, skip: set[str]) -> list[tuple[str, str]]:
        try:
            listed = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        except ApiException as exc:
            raise _api_error(f"listing the pods on node {node}", exc) from exc
        found = []
        for pod in listed.items or []:
            meta = pod.metadata or k8s.V1ObjectMeta()
            owners = {o.kind for o in meta.owner_references or []}
            mirror = "kubernetes.io/config.mirror" in (meta.annotations or {})
            if "DaemonSet" in owners or mirror or _name(pod) in skip:
                continue
            found.append((meta.namespace or "default", _name(pod)))
        return found

    def exclude_node_and_restart(self, job: str, node: str) -> str:
        """Cordon ``node`` and evict the job's pods on it (every pod with ``drain_node``)."""
        on_node = [p for p in self._require(job) if p.spec and p.spec.node_name == node]
        if not on_node:
            raise BackendError(f"job {job!r} has no live worker on node {node!r}")
        self.cordon(node)
        evicted = []
        for pod in on_node:
            name = _name(pod)
            self._evict(name, self.namespace)
            evicted.append(name)
        detail = f"cordoned {node} and evicted the pods of job {job} on it ({', '.join(evicted)})"
        if self.drain_node:
            others = self._other_pods_on(node, set(evicted))
            for namespace, name in others:
                self._evict(name, namespace)
            detail += f"; drained {len(others)} other pods"
        return detail

    def request_checkpoint(self, job: str) -> str:
        """Arm ``checkpoint_now`` in the control file of the job's lowest rank."""
        pods = self._require(job)
        if self.control_dir is None:
            raise BackendError(
                "checkpoint_now on kubernetes needs the trainer's control directory on a "
                "volume the responder mounts (platform setting control_dir)"
            )
        lowest = min(min(pod_ranks(p).ranks) for p in pods)
        path = Path(self.control_dir) / f"rank{lowest}.json"
        return request_checkpoint_in(path, job, self.clock())

    def collect_diagnostics(self, job: str, incident_id: int) -> str:
        """Write each pod's state and log tail to ``incident-<id>.json``."""
        report = []
        for pod in self._require(job):
            meta = pod.metadata or k8s.V1ObjectMeta()
            entry: dict[str, Any] = {
                "pod": meta.name,
                "node": pod.spec.node_name if pod.spec else None,
                "ranks": list(pod_ranks(pod).ranks),
                "phase": pod.status.phase if pod.status else None,
                "conditions": [
                    {"type": c.type, "status": c.status, "reason": c.reason}
                    for c in (pod.status.conditions if pod.status else None) or []
                ],
            }
            try:
                entry["log_tail"] = self.core.read_namespaced_pod_log(
                    meta.name or "", self.namespace, tail_lines=self.log_tail_lines
                )
            except ApiException as exc:
                entry["log_tail"] = f"unavailable: {exc.status} {exc.reason}"
            report.append(entry)
        return report_diagnostics(
            self.diagnostics_dir,
            incident_id,
            job=job,
            platform="kubernetes",
            now=self.clock(),
            kind="pods",
            entries=report,
        )


# --- agent discovery (target files, stormwatch.platforms.targets) ------------------------------


def agent_pods(core: k8s.CoreV1Api, namespace: str, selector: str) -> list[tuple[str, str]]:
    """``(node name, pod IP)`` of every running, scheduled pod of the agent DaemonSet
    (pods matching label ``selector`` in ``namespace``), by node name.

    Raises:
        BackendError: the API call failed.
    """
    try:
        listed = core.list_namespaced_pod(namespace, label_selector=selector)
    except ApiException as exc:
        raise _api_error(f"listing the agent pods {selector} in {namespace}", exc) from exc
    found = []
    for pod in listed.items or []:
        node = pod.spec.node_name if pod.spec else None
        status = pod.status or k8s.V1PodStatus()
        if node and status.pod_ip and status.phase == "Running":
            found.append((node, status.pod_ip))
    return sorted(found)


__all__ = ["COMPLETION_INDEX", "KubernetesBackend", "PodRanks", "agent_pods", "pod_ranks"]
