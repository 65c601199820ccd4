"""Exceptions raised by :mod:`stormwatch.alerts` (tree drawn in the package docstring)."""

from __future__ import annotations

from stormwatch.errors import ConfigError, StormwatchError


class AlertsError(StormwatchError):
    """Base class of the alerts component's runtime errors (bad input is ``ConfigError``)."""


class ToolError(AlertsError):
    """``promtool`` or ``amtool`` is missing, or it rejected the rules or configuration.

    Attributes:
        output: the tool's combined stdout and stderr (may be empty).
    """

    def __init__(self, message: str, output: str = "") -> None:
        self.output = output
        super().__init__(f"{message}\n{output}".rstrip() if output else message)


class StoreError(AlertsError):
    """The responder's SQLite database cannot be opened or updated."""


class NotAResponderDatabase(StoreError, ConfigError):
    """A ``--db`` file is missing, a folder, not SQLite, or SQLite without the responder's
    schema: a user mistake (exit status 2); the message names the file and what was expected."""


class UnknownIncident(AlertsError, ConfigError):
    """The responder's database has no incident with the id given (``stormwatch alerts
    postmortem INCIDENT``); the message lists the ids it has."""


__all__ = [
    "AlertsError",
    "NotAResponderDatabase",
    "StoreError",
    "ToolError",
    "UnknownIncident",
]
