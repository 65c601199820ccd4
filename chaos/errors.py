"""Exceptions raised by :mod:`stormwatch.chaos` (tree drawn in the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stormwatch.errors import ConfigError, StormwatchError


class ChaosError(StormwatchError):
    """Base class of the chaos controller's runtime errors."""


@dataclass(frozen=True)
class Issue:
    """One problem found in an experiment file.

    Attributes:
        path: field path in the file, e.g. ``method[0].fault.rank`` (``""`` for the file itself).
        message: what is wrong and what is allowed.
        line: 1-based line of the field in the file (of its nearest enclosing key when the
            field is missing); None when unknown.
    """

    path: str
    message: str
    line: int | None = None


class InvalidExperiment(ChaosError, ConfigError):
    """An experiment file is not valid; nothing was started.

    Attributes:
        file: the experiment file.
        issues: every problem found, each naming the field path and what is allowed.
    """

    def __init__(self, file: Path | str, issues: list[Issue]) -> None:
        self.file = Path(file)
        self.issues = list(issues)
        lines = []
        for i in self.issues:
            where = f"{self.file}:{i.line}" if i.line is not None else f"{self.file}"
            lines.append(f"{where}: {i.path}: {i.message}" if i.path else f"{where}: {i.message}")
        head = f"{self.file}: invalid experiment ({len(self.issues)} problem"
        head += "s)" if len(self.issues) != 1 else ")"
        super().__init__("\n".join([head, *lines]))


class LabNotReady(ChaosError, ConfigError):
    """The lab (or a service the experiment needs) is not up; start it with ``stormwatch lab up``."""


class FaultError(ChaosError):
    """A fault could not be located, injected or reverted."""


class RankNotFound(FaultError):
    """The rank is not where the fault was sent (an agent answered 404): nothing happened."""


class ActivityFailed(ChaosError):
    """An activity of the method failed (its record says why); the method stops there."""


class RollbackFailed(ChaosError):
    """At least one rollback (or fault revert) failed; the ledger still lists the fault as open."""


class LedgerError(ChaosError):
    """The fault ledger (SQLite) cannot be opened or updated."""


class SelectionError(ChaosError, ValueError):
    """A selector or fault names a node or rank the job does not have (message says which);
    validation turns it into an :class:`Issue`, a run into a failed action."""


class ServiceError(ChaosError):
    """Prometheus, an agent or the responder answered with an error or could not be reached."""


__all__ = [
    "ActivityFailed",
    "ChaosError",
    "FaultError",
    "InvalidExperiment",
    "Issue",
    "LabNotReady",
    "LedgerError",
    "RankNotFound",
    "RollbackFailed",
    "SelectionError",
    "ServiceError",
]
