"""Progress events of ``lab up`` / ``lab down`` (for a display; the library never prints)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ProgressEvent:
    """One step of ``up``/``down``, for a progress display.

    Attributes:
        kind: ``create`` (kernel object), ``start`` (process launched), ``ready``
            (service healthy), ``remove`` (object or process removed), ``info``.
        subject: what the step is about (``prometheus``, ``sw-node0``).
        message: one human-readable line.
    """

    kind: Literal["create", "start", "ready", "remove", "info"]
    subject: str
    message: str


Progress = Callable[[ProgressEvent], None]


def quiet(_event: ProgressEvent) -> None:
    return None


__all__ = ["Progress", "ProgressEvent", "quiet"]
