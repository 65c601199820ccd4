"""The dashboards package's exceptions (tree in ``stormwatch.dashboards``)."""

from __future__ import annotations

from stormwatch.errors import StormwatchError


class DashboardsError(StormwatchError):
    """Base class of the dashboards package's runtime errors."""


class PushError(DashboardsError):
    """Grafana could not be reached or refused a request during a push."""
