"""How a session ends: at interpreter exit (``atexit``) and on SIGTERM, chained.

:class:`ExitHooks` registers ``on_exit(clean)`` with :mod:`atexit` (``clean``: no
unhandled exception ended the program, so the done marker may be written) and, when
asked and possible (only the main thread may set signal handlers), a SIGTERM handler
that calls ``on_signal(signum)`` (flush, post-mortem dump) and then hands the signal to
the handler that was there before: a Python handler is called (torchrun's workers, a
trainer that turns SIGTERM into an exception); the default action is restored and the
signal re-sent, so the process still ends with it (exit status 143); an ignored signal
stays ignored. When the main thread cannot run the handler (it waits in C++, a hung
collective), the wakeup thread's :meth:`ExitHooks.end_unanswered` ends the process in its
place. No torch import here.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from stormwatch.telemetry.lifecycle.guard import logger
from stormwatch.telemetry.lifecycle.sigterm import MAIN_THREAD_GRACE_S


def ended_cleanly() -> bool:
    """At exit: no unhandled exception was reported (``sys.last_value`` is set by the
    interpreter when one was)."""
    return getattr(sys, "last_value", None) is None and getattr(sys, "last_exc", None) is None


class ExitHooks:
    """The session's ``atexit`` callback and SIGTERM handler (see the module docstring).

    Args:
        on_exit: called once at interpreter exit with whether the program ended cleanly.
        on_signal: called with the signal number before the previous handler runs.
    """

    def __init__(self, on_exit: Callable[[bool], None], on_signal: Callable[[int], None]) -> None:
        self._on_exit = on_exit
        self._on_signal = on_signal
        self._previous: Any = None
        self._installed_signal = False
        self._handling = False

    def install(self, *, handle_signals: bool) -> str | None:
        """Register the hooks; returns why the SIGTERM handler could not be set, if so."""
        atexit.register(self._at_exit)
        if not handle_signals:
            return None
        if threading.current_thread() is not threading.main_thread():
            return "init() was called outside the main thread, where no signal handler can be set"
        self._previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._handle)
        self._installed_signal = True
        return None

    def uninstall(self) -> None:
        """Unregister ``atexit``; put the previous SIGTERM handler back if ours is still set."""
        atexit.unregister(self._at_exit)
        if (
            self._installed_signal
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == self._handle
        ):
            signal.signal(signal.SIGTERM, self._previous)
        self._installed_signal = False

    def forget_in_child(self) -> None:
        """In a forked child: no ``atexit`` end, and the SIGTERM handler the session
        displaced back (the child is not the rank; it must not act on the rank's behalf)."""
        self.uninstall()

    def ends_at_default(self) -> bool:
        """Whether a SIGTERM now would end at the default action through our handler: it
        is still the one installed (no framework replaced it) and the handler it displaced
        was ``SIG_DFL``. Any thread."""
        return (
            self._installed_signal
            and self._previous == signal.SIG_DFL
            and signal.getsignal(signal.SIGTERM) == self._handle
        )

    def end_unanswered(self, close: Callable[[], None]) -> None:
        """SIGTERM arrived, its dump is written, and the main thread has not run our handler
        within the grace (it waits in C++: a hung collective). Where the chain ends at the
        default action (:meth:`ends_at_default`), end the process as it would: ``close()``
        (the session, unclean: no done marker), then ``os._exit(143)`` (a thread cannot
        restore ``SIG_DFL``). A Python handler in the chain (a framework's, the trainer's)
        is left to run when it can: without stormwatch it would be as stuck."""
        if not self.ends_at_default():
            return
        logger.warning(
            "stormwatch.telemetry: SIGTERM: the main thread did not run its handler within "
            "%.1f s (it waits in C++, a collective?); the dump is written, ending the process "
            "as SIGTERM's default action would (exit status 143)",
            MAIN_THREAD_GRACE_S,
        )
        try:
            close()
        except Exception:  # the process must still end
            logger.warning("stormwatch.telemetry: closing on SIGTERM failed", exc_info=True)
        os._exit(128 + signal.SIGTERM)

    def _at_exit(self) -> None:
        self._on_exit(ended_cleanly())

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._handling:
            # A second SIGTERM (under srun both slurmstepd and torchrun send one) while the
            # first is being handled: the dump in progress must finish, and the first one
            # still reaches the previous handler afterwards.
            return
        self._handling = True
        try:
            self._on_signal(signum)
        except Exception:  # the signal must still reach the previous handler
            logger.warning("stormwatch.telemetry: flushing on SIGTERM failed", exc_info=True)
        finally:
            self._handling = False
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # SIG_DFL, or a handler not set from Python: the default action, terminate
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


__all__ = ["ExitHooks", "ended_cleanly"]
