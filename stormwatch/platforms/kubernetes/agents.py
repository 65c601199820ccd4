"""Where the node agents are on Kubernetes: the pods of the agent DaemonSet.

:func:`discover_agents` is the public entry point (the chaos target and the target
file use it): list the pods matching a label selector in the agents' namespace and
keep, per node, the Running and Ready pod with an IP, as the shared
:class:`~stormwatch.platforms.AgentEndpoint`: node name, ``<scheme>://<pod IP>:<port>`` of
its container port named ``metrics`` (deploy/kubernetes/base/agent.yaml; the dev
overlay's host-network agent names its 9402 port the same, and its fault API port 9403
``fault-api``, which becomes ``fault_url``), and the pod as ``<namespace>/<name>``.
"""

from __future__ import annotations

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from stormwatch.platforms.endpoints import AgentEndpoint
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.kubernetes.api import KubeApi, api_error

#: The agent DaemonSet's namespace and pod selector as deploy/kubernetes/base ships them.
AGENT_NAMESPACE = "stormwatch"
AGENT_SELECTOR = "app.kubernetes.io/name=stormwatch-agent"


def _pod_name(pod: k8s.V1Pod) -> str:
    return (pod.metadata.name if pod.metadata else None) or ""


def _ready(pod: k8s.V1Pod) -> bool:
    status = pod.status
    if status is None or status.phase != "Running" or not status.pod_ip:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def _named_port(pod: k8s.V1Pod, port_name: str) -> int | None:
    for container in pod.spec.containers if pod.spec else []:
        for port in container.ports or []:
            if port.name == port_name:
                return int(port.container_port)
    return None


def discover_agents(
    api: KubeApi,
    *,
    namespace: str = AGENT_NAMESPACE,
    selector: str = AGENT_SELECTOR,
    port_name: str = "metrics",
    fault_port_name: str = "fault-api",
    scheme: str = "http",
) -> dict[str, AgentEndpoint]:
    """The Ready agents by node name (module docstring); pods not yet scheduled,
    not Running or not Ready are left out (an agent restarting is not an endpoint).

    Raises:
        BackendError: the API refused the list (403 names the RBAC grant), or a Ready
            agent pod has no container port named ``port_name``.
    """
    try:
        listed = api.list_pods(namespace, label_selector=selector)
    except ApiException as exc:
        what = f"listing the agent pods ({selector}) in namespace {namespace}"
        raise api_error(what, "list_pods", exc, namespace=namespace) from exc
    found: dict[str, AgentEndpoint] = {}
    for pod in sorted(listed.items or [], key=_pod_name):
        node = pod.spec.node_name if pod.spec else None
        if node is None or not _ready(pod):
            continue
        name = _pod_name(pod)
        port = _named_port(pod, port_name)
        if port is None:
            raise BackendError(
                f"agent pod {namespace}/{name} has no container port named {port_name!r}"
            )
        ip = str(pod.status.pod_ip if pod.status else None)
        found[node] = AgentEndpoint.on_host(
            node,
            ip,
            port=port,
            fault_port=_named_port(pod, fault_port_name),
            scheme=scheme,
            pod=f"{namespace}/{name}",
        )
    return found


__all__ = ["AGENT_NAMESPACE", "AGENT_SELECTOR", "discover_agents"]
