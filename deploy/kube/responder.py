"""The responder: ServiceAccount, RBAC (from ``RESPONDER_ACCESS``), platform ConfigMap,
Deployment and Service."""

from __future__ import annotations

import yaml

from kube.common import (
    IMAGE,
    JOB_LABEL,
    NAMESPACE,
    RESPONDER_LABELS,
    RESPONDER_PORT,
    RESPONDER_SA,
    TOKEN_SECRET,
    Obj,
    meta,
)
from stormwatch.platforms import PlatformSettings
from stormwatch.platforms.kubernetes import RESPONDER_ACCESS, rbac_rules


def responder_rbac() -> list[Obj]:
    """The responder's two ClusterRoles, generated from ``RESPONDER_ACCESS``, and their
    bindings: nodes cluster-wide, workloads per training namespace."""
    nodes_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": meta("stormwatch-responder-nodes", RESPONDER_LABELS, None),
        # Cordon (patch spec.unschedulable) and read it back; nothing else cluster-wide.
        "rules": rbac_rules(RESPONDER_ACCESS, namespaced=False),
    }
    workloads_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": meta("stormwatch-responder-workloads", RESPONDER_LABELS, None),
        # Bound per training namespace with a RoleBinding; exactly what the backend's
        # calls need (stormwatch.platforms.kubernetes.api.RESPONDER_ACCESS).
        "rules": rbac_rules(RESPONDER_ACCESS, namespaced=True),
    }
    subject = [{"kind": "ServiceAccount", "name": RESPONDER_SA, "namespace": NAMESPACE}]
    nodes_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": meta("stormwatch-responder-nodes", RESPONDER_LABELS, None),
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
        "metadata": meta("stormwatch-responder-workloads", RESPONDER_LABELS),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "stormwatch-responder-workloads",
        },
        "subjects": subject,
    }
    return [nodes_role, workloads_role, nodes_binding, workloads_binding]


def _platform_config() -> Obj:
    platform = PlatformSettings.model_validate(
        {"kubernetes": {"namespace": NAMESPACE, "job_label": JOB_LABEL}}
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta("stormwatch-responder", RESPONDER_LABELS),
        "data": {
            "platform.yaml": yaml.safe_dump(
                platform.model_dump(mode="json", include={"grace_period_s", "kubernetes"}),
                sort_keys=True,
            ),
        },
    }


def _deployment() -> Obj:
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
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta("stormwatch-responder", RESPONDER_LABELS),
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


def responder_objects() -> list[Obj]:
    """ServiceAccount, RBAC, platform ConfigMap, Deployment and Service of the responder."""
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta(RESPONDER_SA, RESPONDER_LABELS),
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta("stormwatch-responder", RESPONDER_LABELS),
        "spec": {
            "selector": {"app.kubernetes.io/name": "stormwatch-responder"},
            "ports": [
                {"name": "http", "port": RESPONDER_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }
    return [sa, *responder_rbac(), _platform_config(), _deployment(), service]
