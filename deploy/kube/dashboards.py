"""The dashboards: one ConfigMap each, for the Grafana sidecar."""

from __future__ import annotations

from kube.common import NAMESPACE, PART_OF, Obj
from stormwatch.dashboards.render import build_all, dumps


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
