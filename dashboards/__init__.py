"""stormwatch.dashboards: Grafana dashboards as code.

* One module per dashboard, built with grafana-foundation-sdk:
  :mod:`~stormwatch.dashboards.cluster` (Cluster overview),
  :mod:`~stormwatch.dashboards.node_gpu` (Node and GPU),
  :mod:`~stormwatch.dashboards.nvlink` (NVLink and collectives),
  :mod:`~stormwatch.dashboards.training` (Training),
  :mod:`~stormwatch.dashboards.incidents` (Incidents); shared helpers in
  :mod:`~stormwatch.dashboards.panels`.
* :func:`build_all` / :func:`write`: deterministic JSON and Grafana provisioning files.
* :func:`push`: create/update on a Grafana through its HTTP API (``stormwatch.clients.GrafanaClient``) (:class:`PushResult`).
* :class:`Annotator`: background Grafana annotations for chaos and responder events
  (:class:`AnnotationSettings`, from ``STORMWATCH_GRAFANA_URL`` + ``GRAFANA_TOKEN``).
* CLI: ``stormwatch dashboards build --out DIR`` and ``stormwatch dashboards push --url URL``.

Exceptions::

    StormwatchError
    ├── ConfigError          bad --out, --prometheus-url, --url, GRAFANA_TOKEN missing,
    │                        bad STORMWATCH_GRAFANA_URL
    └── DashboardsError
        └── PushError        Grafana unreachable or refusing a request
"""

from stormwatch.dashboards.annotations import AnnotationSettings, Annotator
from stormwatch.dashboards.errors import DashboardsError, PushError
from stormwatch.dashboards.panels import uid_for
from stormwatch.dashboards.push import PushResult, push
from stormwatch.dashboards.render import DASHBOARDS, DATASOURCE_UID, build_all, dumps, write

__all__ = [
    "DASHBOARDS",
    "DATASOURCE_UID",
    "AnnotationSettings",
    "Annotator",
    "DashboardsError",
    "PushError",
    "PushResult",
    "build_all",
    "dumps",
    "push",
    "uid_for",
    "write",
]
