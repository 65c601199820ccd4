"""How the runner says what it is doing: a :class:`Reporter` (the CLI prints, libraries stay quiet)."""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    """Receives progress from the runner and the post-mortem."""

    def status(self, text: str) -> None:
        """A transient progress line (``waiting for step 25: at step 12``)."""

    def event(self, text: str) -> None:
        """A line worth keeping (``kill-rank-1: SIGKILL to rank 1 on node0``)."""


class NullReporter:
    """Says nothing."""

    def status(self, text: str) -> None:
        pass

    def event(self, text: str) -> None:
        pass


__all__ = ["NullReporter", "Reporter"]
