"""The agent's exception tree (drawn in :mod:`stormwatch.agent`)."""

from __future__ import annotations

from stormwatch.errors import ConfigError, StormwatchError


class AgentError(StormwatchError):
    """Anything the agent raises on purpose at run time."""


class AgentConfigError(AgentError, ConfigError):
    """An agent setting is invalid; the message names the field and the fix."""


class WebConfigError(AgentConfigError):
    """The ``--web-config-file`` (TLS, basic auth) is invalid; the message names the key."""


class NvmlUnavailable(AgentError):
    """``--gpu-backend nvml`` was asked for but NVML could not be initialised."""


class CollectorError(AgentError):
    """A collector cannot produce its metrics this scrape (reported as ``collector_up 0``)."""


class FaultError(AgentError):
    """A fault could not be injected or reverted."""

    http_status: int = 500


class InvalidFaultRequest(FaultError, ConfigError):
    """A fault request body is invalid (HTTP 400).

    Attributes:
        problems: ``(field, message)`` pairs, the field dotted (``rank``, ``signal``).
    """

    http_status = 400

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(f"{field}: {message}" for field, message in problems))


class FaultNotFound(FaultError):
    """No fault with this id in the ledger (HTTP 404)."""

    http_status = 404


class FaultTargetNotFound(FaultError):
    """The fault's target (e.g. a rank) is not on this node (HTTP 404)."""

    http_status = 404


class FaultTargetAmbiguous(FaultError):
    """The target matches more than one process (e.g. rank 0 of two jobs; HTTP 409)."""

    http_status = 409


class FaultConflict(FaultError):
    """A fault id is reused with a different request body (HTTP 409)."""

    http_status = 409


class LedgerError(AgentError):
    """The fault ledger (SQLite under ``--state-dir``) cannot be opened or written."""


__all__ = [
    "AgentConfigError",
    "AgentError",
    "CollectorError",
    "FaultConflict",
    "FaultError",
    "FaultNotFound",
    "FaultTargetAmbiguous",
    "FaultTargetNotFound",
    "InvalidFaultRequest",
    "LedgerError",
    "NvmlUnavailable",
    "WebConfigError",
]
