"""The node agent: DaemonSet, ServiceAccount, headless Service and ServiceMonitor."""

from __future__ import annotations

from kube.common import (
    AGENT_IMAGE,
    AGENT_LABELS,
    HOST_AGENT_PORT,
    METRICS_HOST_DIR,
    POD_RESOURCES_DIR,
    POD_RESOURCES_SOCKET,
    SCRAPE_INTERVAL,
    Obj,
    meta,
)


def agent_daemonset() -> Obj:
    """The agent on every GPU node: host PID namespace (rank watcher, fault API) and host
    network namespace with ``NET_ADMIN`` (the proc connector, which gives the ranks' exit
    reasons, exists in the host's network namespace only, and older kernels ask for
    ``CAP_NET_ADMIN``; agent/watch/proc_exits.py), NVML through the NVIDIA container runtime,
    the host's metrics folder shared with the ranks, and the kubelet's pod-resources socket
    folder (read-only) for GPU-to-pod attribution."""
    container: Obj = {
        "name": "agent",
        "image": AGENT_IMAGE,
        "args": [
            "agent",
            "run",
            f"--listen=0.0.0.0:{HOST_AGENT_PORT}",
            "--node=$(NODE_NAME)",
            f"--metrics-dir={METRICS_HOST_DIR}",
            "--gpu-backend=nvml",
            "--state-dir=/var/lib/stormwatch/agent",
            f"--pod-resources-socket={POD_RESOURCES_SOCKET}",
        ],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            # The spans' resource, in the semantic conventions' names (stormwatch/otel.py).
            {
                "name": "OTEL_RESOURCE_ATTRIBUTES",
                "value": "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),"
                "k8s.node.name=$(NODE_NAME)",
            },
            # The NVIDIA container runtime injects the driver's NVML for these.
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
        "ports": [{"name": "metrics", "containerPort": HOST_AGENT_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 30,
            "failureThreshold": 4,
        },
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        },
        "securityContext": {
            "runAsUser": 0,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            # Read other containers' /proc/<pid>/environ (rank watcher); signal them
            # (fault API kill_rank); NET_ADMIN: the proc connector on older kernels
            # (the ranks' exit codes and signals), the network faults (dev overlay).
            "capabilities": {
                "drop": ["ALL"],
                "add": ["SYS_PTRACE", "KILL", "DAC_READ_SEARCH", "NET_ADMIN"],
            },
        },
        "volumeMounts": [
            {"name": "metrics", "mountPath": METRICS_HOST_DIR},
            {"name": "state", "mountPath": "/var/lib/stormwatch/agent"},
            {"name": "tmp", "mountPath": "/tmp"},
            # The kubelet's pod-resources API (which pod holds which GPU or MIG instance).
            {"name": "pod-resources", "mountPath": POD_RESOURCES_DIR, "readOnly": True},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta("stormwatch-agent", AGENT_LABELS),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "stormwatch-agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {
                "metadata": {"labels": dict(AGENT_LABELS)},
                "spec": {
                    "hostPID": True,
                    # The proc connector (rank exit reasons) is in the host's network
                    # namespace only; without it stormwatch_proc_connector_up is 0.
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "runtimeClassName": "nvidia",
                    "priorityClassName": "system-node-critical",
                    "serviceAccountName": "stormwatch-agent",
                    "automountServiceAccountToken": False,
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
                    ],
                    "terminationGracePeriodSeconds": 15,
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "metrics",
                            "hostPath": {"path": METRICS_HOST_DIR, "type": "DirectoryOrCreate"},
                        },
                        {
                            "name": "state",
                            "hostPath": {
                                "path": "/var/lib/stormwatch/agent",
                                "type": "DirectoryOrCreate",
                            },
                        },
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                        # DirectoryOrCreate: a node whose kubelet has no such folder still
                        # runs the agent; stormwatch_kubelet_pod_resources_up 0 says why
                        # the GPU series carry no pod labels.
                        {
                            "name": "pod-resources",
                            "hostPath": {"path": POD_RESOURCES_DIR, "type": "DirectoryOrCreate"},
                        },
                    ],
                },
            },
        },
    }


def agent_service_account() -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta("stormwatch-agent", AGENT_LABELS),
        "automountServiceAccountToken": False,
    }


def agent_service() -> Obj:
    """Headless Service over the agents: one endpoint per node for the ServiceMonitor."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta("stormwatch-agent", AGENT_LABELS),
        "spec": {
            "clusterIP": "None",
            "selector": {"app.kubernetes.io/name": "stormwatch-agent"},
            "ports": [
                {
                    "name": "metrics",
                    "port": HOST_AGENT_PORT,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                }
            ],
        },
    }


def agent_service_monitor() -> Obj:
    """Scrape every agent; the node name becomes ``node``.

    The series name their training job in ``training_job``, so ``job`` is the scrape job's
    and the rules need no ``honorLabels``. It stays on for the pod attribution alone: the
    ``DCGM_*`` series carry the ``namespace``, ``pod`` and ``container`` holding the GPU
    (dcgm-exporter's labels, from the kubelet), which the Operator's own target labels (the
    agent's pod) would otherwise replace, moving them to ``exported_*``. With
    ``overrideHonorLabels`` only those move; no stormwatch rule or dashboard reads them."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta("stormwatch-agent", AGENT_LABELS),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "stormwatch-agent"}},
            "endpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": SCRAPE_INTERVAL,
                    "scrapeTimeout": "4s",
                    # Only for the DCGM_* series' pod attribution (see the docstring).
                    "honorLabels": True,
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                            "targetLabel": "node",
                            "action": "replace",
                        }
                    ],
                }
            ],
        },
    }
