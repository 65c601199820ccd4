"""Exceptions raised by the lab (see the tree in :mod:`stormwatch.lab`)."""

from __future__ import annotations

from pathlib import Path

from stormwatch.errors import ConfigError, StormwatchError


class LabError(StormwatchError):
    """The lab could not be brought up, inspected or torn down."""


class LabPermissionError(LabError, ConfigError):
    """The caller lacks the privileges the lab needs (root, or CAP_NET_ADMIN + CAP_SYS_ADMIN)."""


class PortInUseError(LabError, ConfigError):
    """A port the lab wants to listen on is already taken by another process."""


class LabNotUpError(LabError, ConfigError):
    """There is no lab in the run directory (no ``lab.json``, or it was brought down): a
    mistaken ``--run-dir`` or a lab not started, exit status 2 from every command (as
    ``chaos run``'s :class:`~stormwatch.chaos.errors.LabNotReady`)."""


class LabNotFoundError(LabNotUpError):
    """``lab down`` was given a run directory with nothing of a lab in it: no ``lab.json`` nor
    other file of one, and no process, namespace or link of one (``--run-dir`` typo?)."""


class ServiceFailedError(LabError):
    """A lab service exited or did not become healthy in time.

    Attributes:
        service: the service's name in :attr:`LabState.processes` (e.g. ``"prometheus"``).
        log_file: its log file, where the reason usually is.
    """

    def __init__(self, message: str, *, service: str, log_file: Path | None) -> None:
        super().__init__(message)
        self.service = service
        self.log_file = log_file


class LabOwnedElsewhereError(LabError, ConfigError):
    """The lab's names belong to a lab recorded in another run directory (``--run-dir`` typo?)."""


class SlurmError(LabError):
    """The lab's Slurm cluster (:mod:`stormwatch.lab.slurm`) could not be set up or taken
    apart: a tool is missing, munge cannot reach its files, or a process survived the stop.
    A daemon that exits or never reports its nodes idle is a :class:`ServiceFailedError`."""


class JobError(LabError):
    """A training job could not be started, found or stopped."""


class JobTimeoutError(JobError):
    """:meth:`Lab.wait_job` gave up before every node of the job finished."""


__all__ = [
    "JobError",
    "JobTimeoutError",
    "LabError",
    "LabNotFoundError",
    "LabNotUpError",
    "LabOwnedElsewhereError",
    "LabPermissionError",
    "PortInUseError",
    "ServiceFailedError",
    "SlurmError",
]
