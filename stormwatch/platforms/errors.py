"""Exceptions of the platform backends (drawn in :mod:`stormwatch.errors`).

::

    StormwatchError
    └── PlatformError               a platform backend failed
        ├── BackendError            a backend could not carry out an action or find the job
        │   └── NotStopped          processes (steps, pods) of a stop not confirmed gone
        ├── InvalidTargetFile       a target file is not valid (a ConfigError too)
        └── InvalidManifest         a Kubernetes job manifest is not valid (a ConfigError too)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stormwatch.errors import ConfigError, StormwatchError


class PlatformError(StormwatchError):
    """Base class of what the platform backends (lab, Kubernetes, Slurm) raise."""


class BackendError(PlatformError):
    """A platform backend could not carry out an action (e.g. no worker of the job found,
    the platform refused, a command failed); the message names the job, node or command."""


class NotStopped(BackendError):
    """A stop could not confirm that the processes (a Slurm job's steps, a job's pods) it
    stopped are gone within its bound; nothing was started in their place. The message
    names what is left (:mod:`stormwatch.platforms.stopping`)."""


@dataclass(frozen=True)
class TargetIssue:
    """One problem of a target file: the field ``path`` (``agents.port``, ``""`` for the
    file), what is wrong and the fix, and the 1-based ``line`` (None when unknown)."""

    path: str
    message: str
    line: int | None = None


class InvalidTargetFile(PlatformError, ConfigError):
    """A target file is not valid; nothing was started.

    Attributes:
        file: the target file.
        issues: every problem found, one line each: ``<file>:<line>: <field>: <problem>``.
    """

    def __init__(self, file: Path | str, issues: list[TargetIssue]) -> None:
        self.file = Path(file)
        self.issues = list(issues)
        lines = []
        for i in self.issues:
            where = f"{self.file}:{i.line}" if i.line is not None else f"{self.file}"
            lines.append(f"{where}: {i.path}: {i.message}" if i.path else f"{where}: {i.message}")
        count = len(self.issues)
        head = f"{self.file}: invalid target file ({count} problem{'s' if count != 1 else ''})"
        super().__init__("\n".join([head, *lines]))


class InvalidManifest(PlatformError, ConfigError):
    """A Kubernetes job manifest (a target file's ``job.submit`` template) is not valid;
    nothing was sent to the API server.

    Attributes:
        field: where the problem is: a manifest field path (``metadata.name``,
            ``spec.replicatedJobs[0].template``), ``parameters`` (a placeholder no
            parameter fills), or ``""``: the template file as a whole (not YAML, not one
            document, unreadable).
        problem: what is wrong and the fix.
    """

    def __init__(self, field: str, problem: str, *, source: str = "job manifest") -> None:
        """``source`` names the manifest in the message (the template's path)."""
        self.field = field
        self.problem = problem
        super().__init__(f"{source}: {field}: {problem}" if field else f"{source}: {problem}")


__all__ = [
    "BackendError",
    "InvalidManifest",
    "InvalidTargetFile",
    "NotStopped",
    "PlatformError",
    "TargetIssue",
]
