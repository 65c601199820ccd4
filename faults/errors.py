"""Exceptions of :mod:`stormwatch.faults` (tree drawn in :mod:`stormwatch.faults` and
:mod:`stormwatch.errors`).

A kind's agent-side code raises them; the agent's fault API answers with
:attr:`FaultError.http_status`. The controller wraps them once, at its boundary,
into its own :class:`stormwatch.chaos.errors.FaultError`.
"""

from __future__ import annotations

from stormwatch.errors import ConfigError, StormwatchError


class FaultError(StormwatchError):
    """A fault could not be placed, applied or undone (HTTP 500 at the agent's fault API)."""

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


class FaultTargetNotFound(FaultError):
    """The fault's target (e.g. a rank) is not on this node (HTTP 404): nothing was applied."""

    http_status = 404


class FaultTargetAmbiguous(FaultError):
    """The target matches more than one process (e.g. rank 0 of two jobs; HTTP 409)."""

    http_status = 409


class UnplaceableFault(FaultError):
    """The controller cannot place the fault on the cluster's agents (e.g. a partition whose
    every node is on side A, so side B is empty)."""


__all__ = [
    "FaultError",
    "FaultTargetAmbiguous",
    "FaultTargetNotFound",
    "InvalidFaultRequest",
    "UnplaceableFault",
]
