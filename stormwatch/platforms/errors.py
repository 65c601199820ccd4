"""Exceptions of the platform backends (drawn in :mod:`stormwatch.errors`).

::

    StormwatchError
    └── PlatformError               a platform backend failed
        └── BackendError            a backend could not carry out an action or find the job
"""

from __future__ import annotations

from stormwatch.errors import StormwatchError


class PlatformError(StormwatchError):
    """Base class of what the platform backends (lab, Kubernetes, Slurm) raise."""


class BackendError(PlatformError):
    """A platform backend could not carry out an action (e.g. no worker of the job found,
    the platform refused, a command failed); the message names the job, node or command."""


__all__ = ["BackendError", "PlatformError"]
