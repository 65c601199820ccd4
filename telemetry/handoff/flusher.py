"""The background thread that hands a rank's batched telemetry to its files.

A training rank records its per-step and per-collective telemetry in memory
(:class:`~stormwatch.telemetry.handoff.metric_writes.MetricWriter` deferred, the event log's
queue, :class:`~stormwatch.telemetry.events.EventLog`); :class:`Flusher` calls each
``flush`` every :data:`FLUSH_INTERVAL` seconds from one daemon thread, so no file write,
JSON encoding or prometheus-client call happens on the training thread in a step.

Why 0.1 s: the node agent reads the heartbeat (``stormwatch_train_last_progress_timestamp_seconds``)
every 0.5 s and calls a rank stalled after 5 s at the least (``agent/``, the stall
threshold), so a heartbeat reaches the file at most 0.1 s after the progress it records,
and a rank that stops progressing (blocked in a collective, the GIL held in C++) writes
nothing newer: the flusher writes recorded times, never its own clock. The cost: ~10
wake-ups a second of a thread that finds nothing to do most of the time (~5 us each).
At interpreter exit every running flusher does a last round (``atexit``), and the
session flushes on SIGTERM (:meth:`stormwatch.telemetry.rank.RankTelemetry.flush_on_signal`),
so a clean stop loses nothing; a SIGKILL loses at most the last 0.1 s. No torch import
here.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections.abc import Callable, Sequence

#: Seconds between flushes (see the module docstring for the number).
FLUSH_INTERVAL = 0.1
#: Seconds a round waits for another thread's round in progress before it goes ahead
#: (a round takes milliseconds; one blocked longer must not hold up an exit).
ROUND_WAIT_S = 1.0

# The started, not stopped flushers of this process: a last round at interpreter exit
# (the thread is a daemon, killed at exit), whoever forgot to stop them.
_RUNNING: weakref.WeakSet[Flusher] = weakref.WeakSet()


def _flush_at_exit() -> None:
    for flusher in list(_RUNNING):
        flusher.flush()


atexit.register(_flush_at_exit)
# A forked child is not the rank: it must not write what the rank held (its own pid's
# files would count it twice).
os.register_at_fork(after_in_child=_RUNNING.clear)


class Flusher:
    """Calls ``flushes`` every ``interval`` seconds on a daemon thread until :meth:`stop`.

    Args:
        flushes: ``(sink, flush)`` pairs; a flush that raises is handed to ``on_error``
            with its sink's name, and the others still run.
        on_error: ``on_error(sink, exc)``: counts and logs a failure (never raises).
        interval: seconds between rounds (:data:`FLUSH_INTERVAL`).
        name: the thread's name.
    """

    def __init__(
        self,
        flushes: Sequence[tuple[str, Callable[[], None]]],
        *,
        on_error: Callable[[str, BaseException], None],
        interval: float = FLUSH_INTERVAL,
        name: str = "stormwatch-flusher",
    ) -> None:
        self._flushes = tuple(flushes)
        self._on_error = on_error
        self._interval = interval
        self._stop = threading.Event()
        # One round at a time: a round takes what is recorded, then writes it, so a round
        # begun meanwhile (a SIGTERM's) must wait for it, not return with nothing to write
        # while the process ends under the first one (CI cc18: a 0-byte counter file).
        # Reentrant and waited for at most ROUND_WAIT_S: a signal handler's round on the
        # thread it interrupted mid-round, or a round blocked in a write, must not hang
        # the process's exit (the round then goes ahead, as it did without the lock).
        self._round = threading.RLock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread (once); a last round runs at interpreter exit unless stopped."""
        self._thread.start()
        _RUNNING.add(self)

    def flush(self) -> None:
        """One round now, on the calling thread (the end of the session, a SIGTERM), after
        any round in progress on another thread has finished writing."""
        waited = self._round.acquire(timeout=ROUND_WAIT_S)
        try:
            for sink, flush in self._flushes:
                try:
                    flush()
                except Exception as exc:
                    self._on_error(sink, exc)
        finally:
            if waited:
                self._round.release()

    def flush_within(self, timeout: float) -> bool:
        """One round on a helper thread, waited for at most ``timeout`` seconds; whether it
        finished (a round in progress is finished first). For a signal handler: the
        interrupted code may hold a lock a flush needs, and the handler must not wait for
        it forever."""
        helper = threading.Thread(target=self.flush, name=f"{self._thread.name}-now", daemon=True)
        helper.start()
        helper.join(timeout)
        return not helper.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def stop(self, *, timeout: float = 1.0) -> None:
        """Stop the thread (joined for at most ``timeout`` seconds), then a last round on the
        calling thread: nothing recorded before this call is left unwritten."""
        self._stop.set()
        _RUNNING.discard(self)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.flush()


__all__ = ["FLUSH_INTERVAL", "ROUND_WAIT_S", "Flusher"]
