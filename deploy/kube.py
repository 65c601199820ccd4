"""Builders of the Kubernetes objects in deploy/kubernetes/base and examples/ (plain dicts).

Every value the code already knows comes from the code: the agent's and the
responder's ports and flags, the rule groups of alerts/rules/, the Alertmanager
routes of ``stormwatch.alerts.alertmanager``, the dashboards of
``stormwatch.dashboards``, the platform settings of ``stormwatch.platforms``.
deploy/render.py writes them out; overlays (hand-written) adapt them.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

from stormwatch.agent.config import AgentConfig
from stormwatch.alerts.alertmanager import (
    AlertmanagerSettings,
    Route,
    build_alertmanager_config,
)
from stormwatch.alerts.responder.settings import ResponderSettings
from stormwatch.alerts.rulefiles import rule_files
from stormwatch.dashboards.render import build_all, dumps
from stormwatch.platforms import PlatformSettings
from stormwatch.platforms.kubernetes import COMPLETION_INDEX, RESPONDER_ACCESS, rbac_rules

Obj = dict[str, Any]

NAMESPACE = "stormwatch"
IMAGE = "ghcr.io/stormwatch/stormwatch:0.1.0"
PART_OF = {"app.kubernetes.io/part-of": "stormwatch"}
AGENT_LABELS = {"app.kubernetes.io/name": "stormwatch-agent", **PART_OF}
RESPONDER_LABELS = {"app.kubernetes.io/name": "stormwatch-responder", **PART_OF}
#: Host folder the training pods and the agent share (the ranks' STORMWATCH_METRICS_DIR).
METRICS_HOST_DIR = "/run/stormwatch/metrics"
#: Label whose value is the training job's name (the responder's job label).
JOB_LABEL = "stormwatch.io/job"
TOKEN_SECRET = "stormwatch-responder-token"
RESPONDER_SA = "stormwatch-responder"

#: The rank rules' 20 s "just exited" window needs at least 4 scrapes (alerts/rules/ranks.yml).
SCRAPE_INTERVAL = "5s"

_AGENT_DEFAULTS = AgentConfig.model_fields
AGENT_PORT: int = _AGENT_DEFAULTS["listen_port"].default
FAULT_API_PORT: int = _AGENT_DEFAULTS["fault_listen_port"].default
RESPONDER_PORT: int = ResponderSettings.__dataclass_fields__["port"].default


def _meta(name: str, labels: dict[str, str], namespace: str | None = NAMESPACE) -> Obj:
    meta: Obj = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = dict(labels)
    return meta


# --- agent -------------------------------------------------------------------------------


def agent_daemonset() -> Obj:
    """The agent on every GPU node: host PID namespace (rank watcher, fault API), NVML
    through the NVIDIA container runtime, the host's metrics folder shared with the ranks."""
    container: Obj = {
        "name": "agent",
        "image": IMAGE,
        "args": [
            "agent",
            "run",
            f"--listen=0.0.0.0:{AGENT_PORT}",
            "--node=$(NODE_NAME)",
            f"--metrics-dir={METRICS_HOST_DIR}",
            "--gpu-backend=nvml",
            "--state-dir=/var/lib/stormwatch/agent",
        ],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            # The NVIDIA container runtime injects the driver's NVML for these.
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
        "ports": [{"name": "metrics", "containerPort": AGENT_PORT, "protocol": "TCP"}],
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
            # (fault API kill_rank).
            "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE", "KILL", "DAC_READ_SEARCH"]},
        },
        "volumeMounts": [
            {"name": "metrics", "mountPath": METRICS_HOST_DIR},
            {"name": "state", "mountPath": "/var/lib/stormwatch/agent"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta("stormwatch-agent", AGENT_LABELS),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "stormwatch-agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {
                "metadata": {"labels": dict(AGENT_LABELS)},
                "spec": {
                    "hostPID": True,
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
                    ],
                },
            },
        },
    }


def agent_service_account() -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta("stormwatch-agent", AGENT_LABELS),
        "automountServiceAccountToken": False,
    }


def agent_service() -> Obj:
    """Headless Service over the agents: one endpoint per node for the ServiceMonitor."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta("stormwatch-agent", AGENT_LABELS),
        "spec": {
            "clusterIP": "None",
            "selector": {"app.kubernetes.io/name": "stormwatch-agent"},
            "ports": [
                {"name": "metrics", "port": AGENT_PORT, "targetPort": "metrics", "protocol": "TCP"}
            ],
        },
    }


def agent_service_monitor() -> Obj:
    """Scrape every agent; ``honorLabels`` keeps the training job's ``job`` label
    (alerts/rules/ranks.yml), the node name becomes ``node``."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta("stormwatch-agent", AGENT_LABELS),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "stormwatch-agent"}},
            "endpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": SCRAPE_INTERVAL,
                    "scrapeTimeout": "4s",
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


# --- rules and Alertmanager ----------------------------------------------------------------


def prometheus_rule() -> Obj:
    """Every rule group of alerts/rules/*.yml, unchanged, in one PrometheusRule."""
    groups: list[Obj] = []
    for path in rule_files():
        groups.extend(yaml.safe_load(path.read_text(encoding="utf-8"))["groups"])
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _meta("stormwatch", PART_OF),
        "spec": {"groups": groups},
    }


def _matcher(text: str) -> Obj:
    for op in ("=~", "!~", "!=", "="):
        name, sep, value = text.partition(op)
        if sep:
            return {"name": name, "matchType": op, "value": json.loads(value)}
    raise ValueError(f"not a matcher: {text!r}")  # pragma: no cover - our own routes


def _crd_route(route: Route) -> Obj:
    out: Obj = {"receiver": route.receiver}
    if route.matchers:
        out["matchers"] = [_matcher(m) for m in route.matchers]
    for name, key in (
        ("group_by", "groupBy"),
        ("group_wait", "groupWait"),
        ("group_interval", "groupInterval"),
        ("repeat_interval", "repeatInterval"),
    ):
        if getattr(route, name) is not None:
            out[key] = getattr(route, name)
    if route.routes:
        out["routes"] = [_crd_route(r) for r in route.routes]
    return out


def alertmanager_config() -> Obj:
    """The responder's routes and inhibitions (``stormwatch.alerts.alertmanager``, with
    Alertmanager's default timings instead of the lab's) as an AlertmanagerConfig. The
    Prometheus Operator scopes its routes to alerts whose ``namespace`` label is this
    namespace unless the Alertmanager uses it as its global config
    (docs/deploy-kubernetes.md); the Bearer token comes from the responder's Secret."""
    url = f"http://stormwatch-responder.{NAMESPACE}.svc:{RESPONDER_PORT}"
    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp) / "token"  # the settings insist the file exists; the CRD uses a Secret
        token.write_text("unused\n")
        config = build_alertmanager_config(
            AlertmanagerSettings(
                responder_url=url, token_file=token, group_wait_s=30.0, group_interval_s=300.0
            )
        )
    webhook = config.receivers[0].webhook_configs[0]
    crd_webhook = {
        "url": webhook.url,
        "sendResolved": webhook.send_resolved,
        "maxAlerts": webhook.max_alerts,
        "httpConfig": {
            "authorization": {
                "type": "Bearer",
                "credentials": {"name": TOKEN_SECRET, "key": "token"},
            }
        },
    }
    return {
        "apiVersion": "monitoring.coreos.com/v1alpha1",
        "kind": "AlertmanagerConfig",
        "metadata": _meta("stormwatch", PART_OF),
        "spec": {
            "route": _crd_route(config.route),
            "receivers": [
                {"name": r.name, "webhookConfigs": [crd_webhook]} for r in config.receivers
            ],
            "inhibitRules": [
                {
                    "sourceMatch": [_matcher(m) for m in rule.source_matchers],
                    "targetMatch": [_matcher(m) for m in rule.target_matchers],
                    "equal": list(rule.equal),
                }
                for rule in config.inhibit_rules
            ],
        },
    }


# --- responder -----------------------------------------------------------------------------


def responder_objects() -> list[Obj]:
    """ServiceAccount, RBAC, platform ConfigMap, Deployment and Service of the responder."""
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(RESPONDER_SA, RESPONDER_LABELS),
    }
    nodes_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta("stormwatch-responder-nodes", RESPONDER_LABELS, None),
        # Cordon (patch spec.unschedulable) and read it back; nothing else cluster-wide.
        "rules": rbac_rules(RESPONDER_ACCESS, namespaced=False),
    }
    workloads_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta("stormwatch-responder-workloads", RESPONDER_LABELS, None),
        # Bound per training namespace with a RoleBinding; exactly what the backend's
        # calls need (stormwatch.platforms.kubernetes.api.RESPONDER_ACCESS).
        "rules": rbac_rules(RESPONDER_ACCESS, namespaced=True),
    }
    subject = [{"kind": "ServiceAccount", "name": RESPONDER_SA, "namespace": NAMESPACE}]
    nodes_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _meta("stormwatch-responder-nodes", RESPONDER_LABELS, None),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "stormwatch-responder-nodes",
        },
        "subjects": subject,
    }
    workloads_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta("stormwatch-responder-workloads", RESPONDER_LABELS),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "stormwatch-responder-workloads",
        },
        "subjects": subject,
    }
    platform = PlatformSettings.model_validate(
        {"kubernetes": {"namespace": NAMESPACE, "job_label": JOB_LABEL}}
    )
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta("stormwatch-responder", RESPONDER_LABELS),
        "data": {
            "platform.yaml": yaml.safe_dump(
                platform.model_dump(mode="json", include={"kubernetes"}), sort_keys=True
            ),
        },
    }
    container: Obj = {
        "name": "responder",
        "image": IMAGE,
        "args": [
            "alerts",
            "serve",
            f"--listen=0.0.0.0:{RESPONDER_PORT}",
            "--db=/var/lib/stormwatch/responder.db",
            "--token-file=/etc/stormwatch/token/token",
            "--platform=kubernetes",
            "--platform-config=/etc/stormwatch/config/platform.yaml",
            "--prometheus-url=http://prometheus-operated.monitoring.svc:9090",
        ],
        "ports": [{"name": "http", "containerPort": RESPONDER_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10},
        "resources": {
            "requests": {"cpu": "50m", "memory": "128Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "token", "mountPath": "/etc/stormwatch/token", "readOnly": True},
            {"name": "config", "mountPath": "/etc/stormwatch/config", "readOnly": True},
            {"name": "data", "mountPath": "/var/lib/stormwatch"},
        ],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("stormwatch-responder", RESPONDER_LABELS),
        "spec": {
            # One writer of the SQLite incident store: never two responders at once.
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": "stormwatch-responder"}},
            "template": {
                "metadata": {"labels": dict(RESPONDER_LABELS)},
                "spec": {
                    "serviceAccountName": RESPONDER_SA,
                    "securityContext": {"fsGroup": 65532},
                    "containers": [container],
                    "volumes": [
                        {"name": "token", "secret": {"secretName": TOKEN_SECRET}},
                        {"name": "config", "configMap": {"name": "stormwatch-responder"}},
                        {"name": "data", "emptyDir": {}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta("stormwatch-responder", RESPONDER_LABELS),
        "spec": {
            "selector": {"app.kubernetes.io/name": "stormwatch-responder"},
            "ports": [
                {"name": "http", "port": RESPONDER_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }
    return [
        sa,
        nodes_role,
        workloads_role,
        nodes_binding,
        workloads_binding,
        config,
        deployment,
        service,
    ]


# --- dashboards ----------------------------------------------------------------------------


def dashboard_configmaps() -> list[Obj]:
    """One ConfigMap per dashboard, labelled for the Grafana sidecar (kube-prometheus-stack
    ``grafana.sidecar.dashboards.label: grafana_dashboard``)."""
    maps = []
    for uid, data in sorted(build_all().items()):
        maps.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"dashboard-{uid}",
                    "namespace": NAMESPACE,
                    "labels": {"grafana_dashboard": "1", **PART_OF},
                    "annotations": {"grafana_folder": "Stormwatch"},
                },
                "data": {f"{uid}.json": dumps(data)},
            }
        )
    return maps


# --- example training job -------------------------------------------------------------------


def training_job(name: str = "train-demo", nodes: int = 2, gpus_per_node: int = 8) -> list[Obj]:
    """An indexed Job running torchrun (one pod per node, c10d rendezvous on pod 0 through a
    headless Service) with the labels and environment the agent and responder read."""
    labels = {JOB_LABEL: name, **PART_OF}
    rdzv = f"{name}-0.{name}:29500"
    container: Obj = {
        "name": "trainer",
        "image": IMAGE,
        "command": ["torchrun"],
        "args": [
            f"--rdzv-endpoint={rdzv}",
            "--rdzv-backend=c10d",
            f"--rdzv-id={name}",
            "--max-restarts=3",
            "--no-python",
            "stormwatch",
            "train",
            "--steps=1000",
            "--checkpoint-dir=/shared/checkpoints",
            "--log-dir=/shared/logs",
        ],
        "env": [
            # torchrun reads its options from PET_*; the responder reads these two.
            {"name": "PET_NNODES", "value": str(nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": str(gpus_per_node)},
            {
                "name": "PET_NODE_RANK",
                "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}
                },
            },
            {"name": "STORMWATCH_JOB", "value": name},
            {"name": "STORMWATCH_METRICS_DIR", "value": METRICS_HOST_DIR},
            {"name": "STORMWATCH_CONTROL_DIR", "value": f"/shared/control/{name}"},
        ],
        "ports": [{"name": "rdzv", "containerPort": 29500, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": str(gpus_per_node)},
            "limits": {"memory": "64Gi", "nvidia.com/gpu": str(gpus_per_node)},
        },
        "volumeMounts": [
            {"name": "metrics", "mountPath": METRICS_HOST_DIR},
            {"name": "shared", "mountPath": "/shared"},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": 6,
            # Pods deleted or evicted by the responder are retried without counting.
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "subdomain": name,
                    "restartPolicy": "Never",
                    "runtimeClassName": "nvidia",
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "metrics",
                            "hostPath": {"path": METRICS_HOST_DIR, "type": "DirectoryOrCreate"},
                        },
                        {
                            "name": "shared",
                            "persistentVolumeClaim": {"claimName": f"{name}-shared"},
                        },
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "clusterIP": "None",
            # Pod 0 must be resolvable before it is ready: it is the rendezvous host.
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: name},
            "ports": [{"name": "rdzv", "port": 29500, "targetPort": "rdzv", "protocol": "TCP"}],
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{name}-shared", "labels": labels},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "100Gi"}},
        },
    }
    return [service, claim, job]


__all__ = [
    "agent_daemonset",
    "agent_service",
    "agent_service_account",
    "agent_service_monitor",
    "alertmanager_config",
    "dashboard_configmaps",
    "prometheus_rule",
    "responder_objects",
    "training_job",
]
