"""The seam between the Kubernetes backend and the API server: :class:`KubeApi`.

The backend calls these fourteen operations and nothing else. :class:`ClientKubeApi`
carries them out with the official ``kubernetes`` client (``CoreV1Api``,
``BatchV1Api``, ``CustomObjectsApi``); :class:`~.recorded.RecordedKubeApi` answers
them from recorded API bodies (the tests). Both raise
:class:`kubernetes.client.exceptions.ApiException` with the HTTP status and the
server's JSON ``Status`` body when the server refuses; :func:`api_error` turns that
into a :class:`BackendError` that says what was refused and, for a 403, which RBAC
grant is missing.

Each operation's RBAC need is declared once, as an :class:`Access` in
:data:`ACCESS` (keyed by operation name); :data:`RESPONDER_ACCESS` is what the
responder's actions use, and deploy/kube.py writes the responder's ClusterRoles from
it (``tests/deploy`` checks the rendered RBAC grants exactly that).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from stormwatch.platforms.errors import BackendError

#: JobSet's API group, version and plural (kubernetes-sigs/jobset, ``jobset.x-k8s.io/v1alpha2``).
JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"


@dataclass(frozen=True)
class Access:
    """One RBAC grant: ``verb`` on ``resource`` of API ``group`` ("" = core), in a
    namespace (``namespaced``) or cluster-wide (cluster-scoped resources, all-namespace lists)."""

    verb: str
    resource: str
    group: str = ""
    namespaced: bool = True

    def describe(self) -> str:
        """``'delete' on 'pods' (API group core)``."""
        return f"{self.verb!r} on {self.resource!r} (API group {self.group or 'core'})"


#: The RBAC grant each :class:`KubeApi` operation needs.
ACCESS: dict[str, Access] = {
    "list_pods": Access("list", "pods"),
    "list_all_pods": Access("list", "pods", namespaced=False),
    "delete_pod": Access("delete", "pods"),
    "evict_pod": Access("create", "pods/eviction"),
    "read_pod_log": Access("get", "pods/log"),
    "list_events": Access("list", "events"),
    "read_node": Access("get", "nodes", namespaced=False),
    "patch_node": Access("patch", "nodes", namespaced=False),
    "read_job": Access("get", "jobs", "batch"),
    "create_job": Access("create", "jobs", "batch"),
    "delete_job": Access("delete", "jobs", "batch"),
    "read_jobset": Access("get", JOBSET_PLURAL, JOBSET_GROUP),
    "create_jobset": Access("create", JOBSET_PLURAL, JOBSET_GROUP),
    "delete_jobset": Access("delete", JOBSET_PLURAL, JOBSET_GROUP),
}

#: What the responder's actions call (``drain_node`` adds ``list_all_pods``, bound by the user).
RESPONDER_ACCESS: tuple[Access, ...] = tuple(
    ACCESS[op]
    for op in (
        "list_pods",
        "delete_pod",
        "evict_pod",
        "read_pod_log",
        "list_events",
        "read_node",
        "patch_node",
        "read_job",
        "read_jobset",
    )
)

#: What a chaos target (``chaos run --target``) reads: the job (Job or JobSet, its outcome)
#: and its pods in the training namespace, the agent DaemonSet's pods in the agents'.
TARGET_ACCESS: tuple[Access, ...] = tuple(
    ACCESS[op] for op in ("list_pods", "read_job", "read_jobset")
)

#: What starting a job from a manifest adds (whoever runs ``chaos run --target`` with a
#: template): create it, and delete it when the run stops it.
LAUNCHER_ACCESS: tuple[Access, ...] = tuple(
    ACCESS[op] for op in ("create_job", "delete_job", "create_jobset", "delete_jobset")
)


def rbac_rules(accesses: tuple[Access, ...], *, namespaced: bool) -> list[dict[str, Any]]:
    """ClusterRole ``rules`` granting the ``accesses`` of one scope, one rule per
    (group, resource), in the order first seen."""
    rules: dict[tuple[str, str], list[str]] = {}
    for access in accesses:
        if access.namespaced == namespaced:
            verbs = rules.setdefault((access.group, access.resource), [])
            if access.verb not in verbs:
                verbs.append(access.verb)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": verbs}
        for (group, resource), verbs in rules.items()
    ]


class KubeApi(Protocol):
    """The API operations the Kubernetes backend uses (module docstring).

    Every method raises ``ApiException`` (``status``: HTTP code, ``body``: the
    server's JSON ``Status``) when the server answers with an error.
    """

    def list_pods(
        self, namespace: str, *, label_selector: str = "", field_selector: str = ""
    ) -> k8s.V1PodList:
        """``GET /api/v1/namespaces/{namespace}/pods``."""
        ...

    def list_all_pods(self, *, field_selector: str) -> k8s.V1PodList:
        """``GET /api/v1/pods`` (every namespace)."""
        ...

    def delete_pod(self, name: str, namespace: str, body: k8s.V1DeleteOptions) -> None:
        """``DELETE /api/v1/namespaces/{namespace}/pods/{name}``."""
        ...

    def evict_pod(self, name: str, namespace: str, body: k8s.V1Eviction) -> None:
        """``POST /api/v1/namespaces/{namespace}/pods/{name}/eviction`` (policy/v1 Eviction)."""
        ...

    def read_pod_log(self, name: str, namespace: str, *, tail_lines: int) -> str:
        """``GET /api/v1/namespaces/{namespace}/pods/{name}/log?tailLines=N``."""
        ...

    def list_events(self, namespace: str) -> k8s.CoreV1EventList:
        """``GET /api/v1/namespaces/{namespace}/events``."""
        ...

    def read_node(self, name: str) -> k8s.V1Node:
        """``GET /api/v1/nodes/{name}``."""
        ...

    def patch_node(self, name: str, body: k8s.V1Node) -> k8s.V1Node:
        """``PATCH /api/v1/nodes/{name}`` (strategic merge patch)."""
        ...

    def read_job(self, name: str, namespace: str) -> k8s.V1Job:
        """``GET /apis/batch/v1/namespaces/{namespace}/jobs/{name}``."""
        ...

    def create_job(self, namespace: str, body: k8s.V1Job) -> k8s.V1Job:
        """``POST /apis/batch/v1/namespaces/{namespace}/jobs``."""
        ...

    def delete_job(self, name: str, namespace: str, body: k8s.V1DeleteOptions) -> None:
        """``DELETE /apis/batch/v1/namespaces/{namespace}/jobs/{name}``."""
        ...

    def read_jobset(self, name: str, namespace: str) -> dict[str, Any]:
        """``GET /apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets/{name}``."""
        ...

    def create_jobset(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets``."""
        ...

    def delete_jobset(self, name: str, namespace: str, body: k8s.V1DeleteOptions) -> None:
        """``DELETE /apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets/{name}``."""
        ...


class ClientKubeApi:
    """:class:`KubeApi` on the official client (one ``ApiClient`` shared by the three APIs)."""

    def __init__(self, api_client: k8s.ApiClient | None = None) -> None:
        api_client = api_client or k8s.ApiClient()
        self.core = k8s.CoreV1Api(api_client)
        self.batch = k8s.BatchV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)

    def list_pods(
        self, namespace: str, *, label_selector: str = "", field_selector: str = ""
    ) -> k8s.V1PodList:
        return self.core.list_namespaced_pod(
            namespace, label_selector=label_selector or None, field_selector=field_selector or None
        )

    def list_all_pods(self, *, field_selector: str) -> k8s.V1PodList:
        return self.core.list_pod_for_all_namespaces(field_selector=field_selector)

    def delete_pod(self, name: str, namespace: str, body: k8s.V1DeleteOptions) -> None:
        self.core.delete_namespaced_pod(name, namespace, body=body)

    def evict_pod(self, name: str, namespace: str, body: k8s.V1Eviction) -> None:
        self.core.create_namespaced_pod_eviction(name, namespace, body)

    def read_pod_log(self, name: str, namespace: str, *, tail_lines: int) -> str:
        return str(self.core.read_namespaced_pod_log(name, namespace, tail_lines=tail_lines))

    def list_events(self, namespace: str) -> k8s.CoreV1EventList:
        return self.core.list_namespaced_event(namespace)

    def read_node(self, name: str) -> k8s.V1Node:
        return self.core.read_node(name)

    def patch_node(self, name: str, body: k8s.V1Node) -> k8s.V1Node:
        return self.core.patch_node(name, body)

    def read_job(self, name: str, namespace: str) -> k8s.V1Job:
        return self.batch.read_namespaced_job(name, namespace)

    def create_job(self, namespace: str, body: k8s.V1Job) -> k8s.V1Job:
        return self.batch.create_namespaced_job(namespace, body)

    def delete_job(self, name: str, namespace: str, body: k8s.V1DeleteOptions) -> None:
        self.batch.delete_namespaced_job(name, namespace, body=body)

    def read_jobset(self, name: str, namespace: str) -> dict[str, Any]:
        found = self.custom.get_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name
        )
        return dict(found)  # type: ignore[call-overload]

    def create_jobset(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        made = self.custom.create_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, body
        )
        return dict(made)  # type: ignore[call-overload]

    def delete_jobset(self, name: str, namespace: str, body: k8s.V1DeleteOptions) -> None:
        self.custom.delete_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name, body=body
        )


Refusal = Literal["forbidden", "not_found", "disruption_budget", "other"]


def server_status(exc: ApiException) -> k8s.V1Status | None:
    """The server's ``Status`` body of ``exc`` (None when it sent none or not JSON)."""
    try:
        data = json.loads(exc.body or "")
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("kind") != "Status":
        return None
    return k8s.V1Status.from_dict(data)


def refusal(exc: ApiException) -> Refusal:
    """What kind of refusal ``exc`` is, from its status code and the Status body's causes."""
    if exc.status == 403:
        return "forbidden"
    if exc.status == 404:
        return "not_found"
    status = server_status(exc)
    causes = (status.details.causes if status and status.details else None) or []
    if exc.status == 429 and any(c.reason == "DisruptionBudget" for c in causes):
        return "disruption_budget"
    return "other"


def api_error(what: str, operation: str, exc: ApiException, *, namespace: str = "") -> BackendError:
    """A :class:`BackendError` for ``exc`` raised by ``operation`` (a :data:`ACCESS` key)
    while doing ``what``: the HTTP status, the server's message and causes, and for a
    403 the missing RBAC grant."""
    status = server_status(exc)
    said = (status.message if status else None) or exc.reason or "no message"
    causes = (status.details.causes if status and status.details else None) or []
    said += "".join(f"; {c.message}" for c in causes if c.message)
    line = f"kubernetes API: {what} failed: {exc.status} {exc.reason or ''}".rstrip()
    kind = refusal(exc)
    if kind == "forbidden":
        need = ACCESS[operation]
        where = f"in namespace {namespace}" if need.namespaced and namespace else "cluster-wide"
        line += (
            f"; the service account needs RBAC verb {need.describe()} {where} "
            "(ClusterRoles stormwatch-responder-* in deploy/kubernetes/base/responder.yaml)"
        )
    elif kind == "disruption_budget":
        line += "; a PodDisruptionBudget refuses the eviction (relax it or wait)"
    return BackendError(f"{line}: {said}")


__all__ = [
    "ACCESS",
    "JOBSET_GROUP",
    "JOBSET_PLURAL",
    "JOBSET_VERSION",
    "LAUNCHER_ACCESS",
    "RESPONDER_ACCESS",
    "TARGET_ACCESS",
    "Access",
    "ClientKubeApi",
    "KubeApi",
    "api_error",
    "rbac_rules",
    "refusal",
    "server_status",
]
