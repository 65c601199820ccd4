"""The Kubernetes platform backend: :class:`KubernetesBackend`.

The job's workers are found as :mod:`.workers` says (a Job, an indexed Job, a JobSet,
or pods by label); every call goes through the :class:`~.api.KubeApi` seam.

Actions, each read back from the API before it reports success:

* restart workers: delete the job's pods (``V1DeleteOptions`` with ``gracePeriodSeconds``
  = the grace period, background propagation: the kubelet sends SIGTERM, SIGKILL after
  it); the Job controller recreates them and torchrun rendezvous again. Read back: the
  old pods gone (no longer listed, or finished: their processes have exited; not merely
  marked for deletion) within the grace period + :data:`POD_GONE_MARGIN_S`
  (:class:`~stormwatch.platforms.errors.NotStopped` otherwise, :mod:`..stopping`), then as
  many live pods as before, all Running, none with an old UID;
* exclude a node: cordon it (patch ``spec.unschedulable``; read back: the node says
  unschedulable), then evict the job's pods on it with ``policy/v1`` Evictions
  (honours PodDisruptionBudgets; a refusal leaves the node cordoned and says so).
  ``drain_node`` evicts the node's other pods too (``kubectl drain`` semantics:
  DaemonSet and mirror pods stay). Read back: the evicted pods gone (as above), then
  replacements Running, none on the node;
* checkpoint now: the trainer's control file on a volume the responder shares with
  the job (``control_dir``); without one it raises;
* collect diagnostics: the workload, each pod's phase, node, ranks, conditions and log
  tail, and the namespace's events about the job and its pods, written to
  ``<diagnostics_dir>/incident-<id>.json``.

Every refusal of the API becomes a :class:`BackendError` saying what was seen
(:func:`~.api.api_error`: a 403 names the RBAC grant, a 429 the disruption budget).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from stormwatch.platforms.base import request_checkpoint_in, write_diagnostics
from stormwatch.platforms.errors import BackendError, NotStopped
from stormwatch.platforms.kubernetes.api import ClientKubeApi, KubeApi, api_error, refusal
from stormwatch.platforms.kubernetes.workers import (
    DONE_PHASES,
    Workload,
    WorkloadKind,
    find_workload,
    is_live,
    pod_ranks,
)
from stormwatch.platforms.stopping import DEFAULT_GRACE_PERIOD_S

#: Seconds beyond the grace period for a deleted pod to be gone: the kubelet reports the
#: containers' end at its next pod sync (about 10 s), the Job controller drops its
#: tracking finalizer, the API server removes the object.
POD_GONE_MARGIN_S = 60.0


def _name(pod: k8s.V1Pod) -> str:
    return (pod.metadata.name if pod.metadata else None) or ""


def _uid(pod: k8s.V1Pod) -> str:
    return (pod.metadata.uid if pod.metadata else None) or ""


def _node(pod: k8s.V1Pod) -> str | None:
    return pod.spec.node_name if pod.spec else None


def _phase(pod: k8s.V1Pod) -> str | None:
    return pod.status.phase if pod.status else None


def _running_of(pods: list[k8s.V1Pod], uids: set[str] | None) -> list[k8s.V1Pod]:
    """Those of ``pods`` (with a UID in ``uids``; all when None) whose processes may still
    run: listed and not finished, being deleted or not."""
    return [p for p in pods if (uids is None or _uid(p) in uids) and _phase(p) not in DONE_PHASES]


def _seen(pods: list[k8s.V1Pod]) -> str:
    return (
        ", ".join(f"{_name(p)} (uid {_uid(p)[:8]}, {_phase(p)}, node {_node(p)})" for p in pods)
        or "no live pod"
    )


@dataclass(frozen=True, kw_only=True)
class KubernetesBackend:
    """The Kubernetes backend (module docstring).

    Attributes:
        api: the API seam (:meth:`connect` builds a :class:`~.api.ClientKubeApi` from
            the in-cluster service account or the local kubeconfig).
        namespace: where the job runs.
        diagnostics_dir: where ``collect_diagnostics`` writes (created on demand).
        job_label: pod label whose value is the job name (workloads found by label).
        workload: ``auto`` (a Job of the job's name, else a JobSet, else pods by
            label), or pinned to ``Job``, ``JobSet`` or ``label``.
        control_dir: the trainer's control directory as the responder sees it (a
            shared volume); None: ``request_checkpoint`` raises.
        drain_node: ``exclude_node_and_restart`` also evicts the node's other pods.
        grace_period_s: termination grace period (s) of deleted and evicted pods: the
            kubelet's SIGTERM to SIGKILL (:mod:`..stopping`).
        log_tail_lines: log lines per pod in the diagnostics.
        readback_timeout_s: how long an action waits for the replacement pods to run
            (300 s: scheduling plus an image pull of a multi-GB training image).
        poll_s: interval of the read-back polls.
        clock: Unix time source (seconds); sleep: waits between polls (seconds).
    """

    api: KubeApi
    namespace: str
    diagnostics_dir: Path
    job_label: str = "stormwatch.io/job"
    workload: WorkloadKind = "auto"
    control_dir: Path | None = None
    drain_node: bool = False
    grace_period_s: int = DEFAULT_GRACE_PERIOD_S
    log_tail_lines: int = 200
    readback_timeout_s: float = 300.0
    poll_s: float = 2.0
    clock: Callable[[], float] = field(default=time.time)
    sleep: Callable[[float], None] = field(default=time.sleep)

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
        return cls(api=ClientKubeApi(), **settings)

    def find(self, job: str) -> Workload:
        """The workload running ``job`` (:func:`~.workers.find_workload`)."""
        return find_workload(
            self.api, job, self.namespace, kind=self.workload, job_label=self.job_label
        )

    def listed_pods(self, workload: Workload) -> list[k8s.V1Pod]:
        """Every pod of ``workload`` the API lists (finished and terminating ones too).

        Raises:
            BackendError: the API refused the list.
        """
        try:
            listed = self.api.list_pods(self.namespace, label_selector=workload.selector)
        except ApiException as exc:
            what = f"listing the pods of {workload.describe()}"
            raise api_error(what, "list_pods", exc, namespace=self.namespace) from exc
        return sorted(listed.items or [], key=_name)

    def live_pods(self, workload: Workload) -> list[k8s.V1Pod]:
        """The live pods (not finished, not being deleted) of ``workload``, by name; empty
        once every pod has gone.

        Raises:
            BackendError: the API refused the list.
        """
        return [p for p in self.listed_pods(workload) if is_live(p)]

    def wait_pods_gone(self, workload: Workload, *, did: str) -> None:
        """Poll until no pod of ``workload`` may still run (:func:`_running_of`), within the
        grace period + :data:`POD_GONE_MARGIN_S`.

        Raises:
            NotStopped: some still listed and not finished then (named with ``did``).
            BackendError: the API refused the list.
        """
        bound = self.grace_period_s + POD_GONE_MARGIN_S
        deadline = self.clock() + bound
        while left := _running_of(self.listed_pods(workload), None):
            if self.clock() >= deadline:
                raise NotStopped(f"{did}, but {self._not_gone(left, bound)}")
            self.sleep(self.poll_s)

    def _not_gone(self, pods: list[k8s.V1Pod], bound: float) -> str:
        return (
            f"after {bound:g} s these pods still run (the kubelet sends SIGKILL "
            f"{self.grace_period_s} s after SIGTERM; is their node answering?): {_seen(pods)}"
        )

    def pods(self, job: str) -> tuple[Workload, list[k8s.V1Pod]]:
        """The job's workload and its live pods (not finished, not being deleted), by name.

        Raises:
            BackendError: the job has no live pod, or the API refused.
        """
        workload = self.find(job)
        pods = self.live_pods(workload)
        if not pods:
            raise BackendError(
                f"no live worker of job {job!r} found (looked for {workload.describe()})"
            )
        return workload, pods

    def ranks(self, job: str) -> dict[int, str]:
        """Global rank -> node of the job's scheduled pods."""
        workload, pods = self.pods(job)
        placement: dict[int, str] = {}
        for pod in pods:
            found = pod_ranks(pod, pods_per_job=workload.pods_per_job)
            if found.node is not None:
                placement.update(dict.fromkeys(found.ranks, found.node))
        return dict(sorted(placement.items()))

    def _delete_options(self) -> k8s.V1DeleteOptions:
        return k8s.V1DeleteOptions(
            grace_period_seconds=self.grace_period_s, propagation_policy="Background"
        )

    def _evict(self, name: str, namespace: str, cordoned: str) -> None:
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=self._delete_options(),
        )
        try:
            self.api.evict_pod(name, namespace, body)
        except ApiException as exc:
            if refusal(exc) == "not_found":  # gone already
                return
            error = api_error(
                f"evicting pod {namespace}/{name}", "evict_pod", exc, namespace=namespace
            )
            raise BackendError(
                f"{error}; node {cordoned} stays cordoned (kubectl uncordon {cordoned} to undo)"
            ) from exc

    def _await(
        self, workload: Workload, gone: set[str], count: int, *, avoid: str | None, did: str
    ) -> list[k8s.V1Pod]:
        """Poll until the pods with a UID in ``gone`` are gone (:func:`_running_of`, within the
        grace period + :data:`POD_GONE_MARGIN_S`, NotStopped otherwise), then until ``count``
        live pods run, none with a UID in ``gone``, none on ``avoid`` (within
        :attr:`readback_timeout_s` of the old ones being gone)."""
        bound = self.grace_period_s + POD_GONE_MARGIN_S
        gone_by = self.clock() + bound
        deadline: float | None = None
        while True:
            listed = self.listed_pods(workload)
            pods = [p for p in listed if is_live(p)]
            if old := _running_of(listed, gone):
                if self.clock() >= gone_by:
                    raise NotStopped(f"{did}, but {self._not_gone(old, bound)}")
                self.sleep(self.poll_s)
                continue
            if deadline is None:
                deadline = self.clock() + self.readback_timeout_s
            fresh = [p for p in pods if _uid(p) not in gone]
            if (
                len(fresh) == len(pods) == count
                and all(_phase(p) == "Running" for p in pods)
                and (avoid is None or all(_node(p) != avoid for p in pods))
            ):
                return pods
            if self.clock() >= deadline:
                where = f", none on {avoid}" if avoid else ""
                raise BackendError(
                    f"{did}, but after {self.readback_timeout_s:g} s {workload.describe()} "
                    f"does not have {count} new Running pods{where}: seen {_seen(pods)}"
                )
            self.sleep(self.poll_s)

    def restart_workers(self, job: str) -> str:
        """Delete every pod of ``job``; read back their replacements Running."""
        workload, pods = self.pods(job)
        for pod in pods:
            name = _name(pod)
            try:
                self.api.delete_pod(name, self.namespace, self._delete_options())
            except ApiException as exc:
                if refusal(exc) != "not_found":
                    what = f"deleting pod {self.namespace}/{name}"
                    raise api_error(what, "delete_pod", exc, namespace=self.namespace) from exc
        did = f"deleted {len(pods)} pods of job {job} ({', '.join(map(_name, pods))})"
        new = self._await(workload, {_uid(p) for p in pods}, len(pods), avoid=None, did=did)
        return f"{did}; {len(new)} new pods Running ({', '.join(map(_name, new))})"

    def cordon(self, node: str) -> None:
        """Mark ``node`` unschedulable (``kubectl cordon``) and read it back.

        Raises:
            BackendError: the API refused (e.g. no such node), or the node does not
                read back unschedulable.
        """
        body = k8s.V1Node(spec=k8s.V1NodeSpec(unschedulable=True))
        try:
            self.api.patch_node(node, body)
            seen = self.api.read_node(node)
        except ApiException as exc:
            raise api_error(f"cordoning node {node}", "patch_node", exc) from exc
        if not (seen.spec and seen.spec.unschedulable):
            raise BackendError(f"cordoned node {node}, but it reads back schedulable")

    def _other_pods_on(self, node: str, skip: set[str]) -> list[tuple[str, str]]:
        try:
            listed = self.api.list_all_pods(field_selector=f"spec.nodeName={node}")
        except ApiException as exc:
            raise api_error(f"listing the pods on node {node}", "list_all_pods", exc) from exc
        found = []
        for pod in listed.items or []:
            meta = pod.metadata or k8s.V1ObjectMeta()
            owners = {o.kind for o in meta.owner_references or []}
            mirror = "kubernetes.io/config.mirror" in (meta.annotations or {})
            if "DaemonSet" in owners or mirror or _name(pod) in skip or not is_live(pod):
                continue
            found.append((meta.namespace or "default", _name(pod)))
        return found

    def exclude_node_and_restart(self, job: str, node: str) -> str:
        """Cordon ``node``, evict the job's pods on it (every pod with ``drain_node``), and
        read back the replacements Running elsewhere."""
        workload, pods = self.pods(job)
        on_node = [p for p in pods if _node(p) == node]
        if not on_node:
            raise BackendError(f"job {job!r} has no live worker on node {node!r}")
        self.cordon(node)
        evicted = [_name(p) for p in on_node]
        for name in evicted:
            self._evict(name, self.namespace, node)
        did = f"cordoned {node} and evicted the pods of job {job} on it ({', '.join(evicted)})"
        if self.drain_node:
            others = self._other_pods_on(node, set(evicted))
            for namespace, name in others:
                self._evict(name, namespace, node)
            did += f"; drained {len(others)} other pods"
        gone = {_uid(p) for p in on_node}
        new = self._await(workload, gone, len(pods), avoid=node, did=did)
        placed = sorted({str(_node(p)) for p in new})
        return f"{did}; {len(new)} pods Running, none on {node} (nodes {', '.join(placed)})"

    def request_checkpoint(self, job: str) -> str:
        """Arm ``checkpoint_now`` in the control file of the job's lowest rank."""
        workload, pods = self.pods(job)
        if self.control_dir is None:
            raise BackendError(
                "checkpoint_now on kubernetes needs the trainer's control directory on a "
                "volume the responder mounts (platform setting control_dir)"
            )
        lowest = min(min(pod_ranks(p, pods_per_job=workload.pods_per_job).ranks) for p in pods)
        path = Path(self.control_dir) / f"rank{lowest}.json"
        return request_checkpoint_in(path, job, self.clock())

    def _events(self, names: set[str]) -> list[dict[str, Any]]:
        try:
            listed = self.api.list_events(self.namespace)
        except ApiException as exc:
            return [{"unavailable": f"{exc.status} {exc.reason}"}]
        return [
            {
                "object": f"{e.involved_object.kind}/{e.involved_object.name}",
                "type": e.type,
                "reason": e.reason,
                "message": e.message,
                "count": e.count,
                "last": e.last_timestamp or e.event_time,
            }
            for e in listed.items or []
            if e.involved_object and e.involved_object.name in names
        ]

    def collect_diagnostics(self, job: str, incident_id: int) -> str:
        """Write the workload, each pod's state and log tail, and their events to
        ``incident-<id>.json``."""
        workload, pods = self.pods(job)
        report = []
        for pod in pods:
            entry: dict[str, Any] = {
                "pod": _name(pod),
                "uid": _uid(pod),
                "node": _node(pod),
                "ranks": list(pod_ranks(pod, pods_per_job=workload.pods_per_job).ranks),
                "phase": _phase(pod),
                "conditions": [
                    {"type": c.type, "status": c.status, "reason": c.reason}
                    for c in (pod.status.conditions if pod.status else None) or []
                ],
            }
            try:
                entry["log_tail"] = self.api.read_pod_log(
                    _name(pod), self.namespace, tail_lines=self.log_tail_lines
                )
            except ApiException as exc:
                entry["log_tail"] = f"unavailable: {exc.status} {exc.reason}"
            report.append(entry)
        path = write_diagnostics(
            self.diagnostics_dir,
            incident_id,
            {
                "job": job,
                "platform": "kubernetes",
                "time": self.clock(),
                "workload": {"kind": workload.kind, "name": workload.name},
                "pods": report,
                "events": self._events({job, *map(_name, pods)}),
            },
        )
        return f"diagnostics of {len(report)} pods of job {job} in {path}"


__all__ = ["POD_GONE_MARGIN_S", "KubernetesBackend"]
