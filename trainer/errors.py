"""Exceptions raised by :mod:`stormwatch.trainer` (tree drawn in the package docstring)."""

from __future__ import annotations

from pathlib import Path

from stormwatch.errors import ConfigError, StormwatchError


class TrainerError(StormwatchError):
    """Base class of the trainer's runtime errors (not user input: that is ``ConfigError``)."""


class CorpusError(TrainerError):
    """The training corpus cannot be read or is too small for the configured sequence length."""


class CheckpointError(TrainerError):
    """A checkpoint could not be saved, found or loaded consistently on every rank."""


class ResumeRefused(CheckpointError, ConfigError):
    """The checkpoint folder cannot be resumed by this run: every checkpoint in it is damaged,
    or the latest was written with settings this run changes. A user's decision (exit status
    2): the message names the folders or the options and how to proceed. Raised on every rank.
    """

    exit_code = 2


class Terminated(TrainerError):
    """The rank received SIGTERM (torchrun tearing the worker group down); exit status 143."""

    exit_code = 128 + 15


class UnwritableDirError(ConfigError):
    """A folder option names a folder that cannot be created or written.

    Unlike other ``ConfigError``\\ s it may hold on one node and not another,
    so the CLI lets the first rank of every node report it (not only rank 0).

    Attributes:
        option: the command-line option, e.g. ``--checkpoint-dir``.
        path: the folder.
    """

    def __init__(self, message: str, *, option: str, path: Path) -> None:
        super().__init__(message)
        self.option = option
        self.path = path


class InjectedFault(TrainerError):
    """Raised by the ``error_at_step`` fault point of the control file."""


class ControlFileError(TrainerError):
    """The control file exists but is not valid JSON of the documented shape (logged and
    counted by the step loop, never raised out of training)."""


__all__ = [
    "CheckpointError",
    "ControlFileError",
    "CorpusError",
    "InjectedFault",
    "ResumeRefused",
    "Terminated",
    "TrainerError",
    "UnwritableDirError",
]
