"""Exceptions of the shared service clients (drawn in :mod:`stormwatch.errors`).

::

    StormwatchError
    └── ClientError                 a service's HTTP API failed (attribute ``status``)
        ├── PrometheusAPIError      the Prometheus HTTP API (unreachable, HTTP error, status: error)
        ├── ResponderClientError    the responder's HTTP API (404 / 409 from approve, ...)
        └── GrafanaAPIError         Grafana's HTTP API (dashboards, folders, annotations)
"""

from __future__ import annotations

from stormwatch.errors import StormwatchError


class ClientError(StormwatchError):
    """A service's HTTP API was unreachable, answered with an error status, or answered
    something that is not what the API documents.

    Attributes:
        status: the HTTP status, or ``None`` when no answer came back.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PrometheusAPIError(ClientError):
    """The Prometheus HTTP API was unreachable or answered with an error (the message
    carries Prometheus' ``errorType`` and ``error``)."""


class ResponderClientError(ClientError):
    """The responder's HTTP API was unreachable or answered with an error."""


class GrafanaAPIError(ClientError):
    """Grafana's HTTP API was unreachable or answered with an error."""


__all__ = ["ClientError", "GrafanaAPIError", "PrometheusAPIError", "ResponderClientError"]
