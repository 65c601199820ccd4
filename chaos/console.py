"""Progress output for the CLI and the demo (rich): a live status line plus kept event lines."""

from __future__ import annotations

import time

from rich.console import Console
from rich.status import Status


class ConsoleReporter:
    """:class:`~stormwatch.chaos.execution.runner.Reporter` printing to a rich console (stderr by default).

    ``status`` lines replace each other (a spinner on a terminal; on a pipe, at most
    one line every ``quiet_seconds``); ``event`` lines stay.
    """

    def __init__(self, console: Console | None = None, *, quiet_seconds: float = 5.0) -> None:
        self.console = console or Console(stderr=True)
        self._status: Status | None = None
        self._quiet = quiet_seconds
        self._last_plain = 0.0
        self._last_text = ""

    def status(self, text: str) -> None:
        if self.console.is_terminal:
            if self._status is None:
                self._status = self.console.status(text)
                self._status.start()
            else:
                self._status.update(text)
            return
        now = time.monotonic()
        if text != self._last_text and now - self._last_plain >= self._quiet:
            self.console.print(f"  … {text}", highlight=False, soft_wrap=True)
            self._last_plain, self._last_text = now, text

    def event(self, text: str) -> None:
        self.stop()
        self.console.print(text, highlight=False, soft_wrap=True)

    def stop(self) -> None:
        """Remove the status line (call before printing anything else)."""
        if self._status is not None:
            self._status.stop()
            self._status = None


__all__ = ["ConsoleReporter"]
