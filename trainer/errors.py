"""Exceptions raised by :mod:`stormwatch.trainer` (tree drawn in the package docstring)."""

from __future__ import annotations

from stormwatch.errors import StormwatchError


class TrainerError(StormwatchError):
    """Base class of the trainer's runtime errors (not user input: that is ``ConfigError``)."""


class CorpusError(TrainerError):
    """The training corpus cannot be read or is too small for the configured sequence length."""


class CheckpointError(TrainerError):
    """A checkpoint could not be saved, found or loaded consistently on every rank."""


class Terminated(TrainerError):
    """The rank received SIGTERM (torchrun tearing the worker group down); exit status 143."""

    exit_code = 128 + 15


__all__ = ["CheckpointError", "CorpusError", "Terminated", "TrainerError"]
