"""The chaos controller's access: one ClusterRole granting what a kubernetes target reads
(``TARGET_ACCESS``) and what submitting a job adds (``LAUNCHER_ACCESS``), generated from
the declarations the client calls are checked against. Nothing binds it: bind it with a
RoleBinding, to whoever runs ``stormwatch chaos run --target``, in the training namespace
and in the agents' namespace."""

from __future__ import annotations

from kube.common import PART_OF, Obj
from stormwatch.platforms.kubernetes import LAUNCHER_ACCESS, TARGET_ACCESS, rbac_rules

CHAOS_ROLE = "stormwatch-chaos"


def chaos_rbac() -> list[Obj]:
    """The ClusterRole ``stormwatch-chaos`` (module docstring)."""
    labels = {"app.kubernetes.io/name": CHAOS_ROLE, **PART_OF}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": CHAOS_ROLE, "labels": labels},
            "rules": rbac_rules((*TARGET_ACCESS, *LAUNCHER_ACCESS), namespaced=True),
        }
    ]
