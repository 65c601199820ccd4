"""Clients of the services stormwatch talks to, one per service (aiohttp).

* :mod:`.prometheus`: the Prometheus HTTP API (:class:`AsyncPrometheusClient`, its
  blocking face :class:`PrometheusClient`, the :class:`PrometheusAPI` /
  :class:`AsyncPrometheusAPI` protocols components depend on).
* :mod:`.responder`: the responder's HTTP API (:class:`ResponderClient`), parsed into
  the responder's own records (:mod:`stormwatch.contracts.responder`).
* :mod:`.grafana`: the few calls of Grafana's HTTP API stormwatch makes (folders,
  dashboards, annotations; :class:`GrafanaClient`), used by ``dashboards push`` and the
  annotator.
* :mod:`.http`: what they share: :class:`HttpOptions` (TLS, basic auth, Bearer token,
  headers), one request helper with one error mapping, the session-owning base class.
  The chaos controller's agent client (``stormwatch.chaos.clients.agent``) uses it too.

Exceptions (:mod:`.errors`, drawn in :mod:`stormwatch.errors`)::

    ClientError                     a service's HTTP API failed (attribute ``status``)
    ├── PrometheusAPIError
    ├── ResponderClientError
    └── GrafanaAPIError
"""

from stormwatch.clients.errors import (
    ClientError,
    GrafanaAPIError,
    PrometheusAPIError,
    ResponderClientError,
)
from stormwatch.clients.grafana import GrafanaClient
from stormwatch.clients.http import HttpOptions
from stormwatch.clients.prometheus import (
    Alert,
    AsyncPrometheusAPI,
    AsyncPrometheusClient,
    PrometheusAPI,
    PrometheusClient,
    Sample,
    Series,
    Target,
    promql_string,
)
from stormwatch.clients.responder import ResponderClient

__all__ = [
    "Alert",
    "AsyncPrometheusAPI",
    "AsyncPrometheusClient",
    "ClientError",
    "GrafanaAPIError",
    "GrafanaClient",
    "HttpOptions",
    "PrometheusAPI",
    "PrometheusAPIError",
    "PrometheusClient",
    "ResponderClient",
    "ResponderClientError",
    "Sample",
    "Series",
    "Target",
    "promql_string",
]
