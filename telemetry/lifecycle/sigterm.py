"""The post-mortem dump at SIGTERM, written before anything that can block. No torch import.

A session that handles signals (:func:`stormwatch.telemetry.init` with ``handle_signals``)
owns one :class:`SigtermDump`: its SIGTERM handler (:mod:`.exits`) writes the dump
through it, and so does the thread below. A handler alone runs in the main thread,
between bytecodes, after the handlers installed later than it. In a hung job that is too
late, or never:

* a rank waiting in a collective is in C++ until the collective returns, which, when a
  peer hangs, it does not; no Python handler runs;
* PyTorch Lightning's SIGTERM handler (``_SignalConnector``, 2.6) broadcasts a tensor to
  the other ranks before calling the handler it displaced (the API's). On the hung rank
  that broadcast is issued first, so the flight recorder shows it as one more collective,
  level with its peers' pending all-reduce, and the rank no longer looks behind; then it
  blocks, so the API's handler never runs.

Measured with examples/lightning/train.py, 3 ranks on the CPU (gloo), rank 1's batches
stalled, SIGTERM to every process then SIGKILL 5 s later (what Slurm, ``KillWait=5``,
does): with the API's handler alone no rank wrote a dump; dumping from a thread alone,
every rank's dump held 40 collectives (rank 1's last one Lightning's broadcast); with
both ways below, rank 1's held 39 and the others' 40 (the last in flight), and the
post-mortem named rank 1, certain, in 4 runs of 4.

:class:`SigtermDump` writes the dump once per process, whichever of two ways comes first:

* :meth:`SigtermDump.take_front`: a SIGTERM handler put in front of those installed (call
  it once the framework has installed its own); it dumps, then calls the one it displaced;
* :meth:`SigtermDump.watch`: a daemon thread woken through the interpreter's wakeup
  descriptor (:func:`signal.set_wakeup_fd`: the C-level handler writes the signal's
  number there at once, whatever the main thread does), for a main thread waiting in a
  collective. Only a signal with a Python handler writes to it (the API's is one).
  Not installed where another wakeup descriptor is set (an event loop's).

A session without ``handle_signals`` (the job handles SIGTERM itself, like the reference
trainer) watches with a second :class:`SigtermDump` whose "dump" only marks the stop
(:meth:`stormwatch.telemetry.Session.stop_requested`: the agent counts the exit as a
stop, not a failure) and which never ends the process: the job's handler cannot run while
its main thread waits in C++ (a node cut off mid-collective: torchrun SIGTERMs, then
SIGKILLs, ranks that never ran a line of Python in between).

Either waits for a dump the other is writing, so the snapshot is taken before the main
thread goes on to the framework's handler.

After the thread's dump, the main thread has :data:`MAIN_THREAD_GRACE_S` to run a Python
SIGTERM handler (it then calls :meth:`SigtermDump.answered`). When it does not (it waits in
C++), ``on_unanswered`` is called from the thread: the session ends the process as the
default action would when that is where its handler chain ends (a rank hung in a
collective would otherwise live until SIGKILL; without stormwatch SIGTERM kills it at once). Both need the main thread to be installed. The
session starts the thread at :func:`~stormwatch.telemetry.init`; an integration whose
framework installs its own handler later puts the dump in front of it
(:meth:`stormwatch.telemetry.Session.dump_first_on_sigterm`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

#: Seconds the main thread gets, after the thread's dump, to run its Python SIGTERM handler
#: before ``on_unanswered`` is called. A main thread running Python code runs the handler
#: within one bytecode (microseconds) and one in ``time.sleep`` or a ``select`` at once; one
#: in a C call that releases the GIL (a collective) never does. 1.5 s leaves room for a
#: loaded node's scheduling delay and stays well inside Slurm's default KillWait (30 s).
MAIN_THREAD_GRACE_S = 1.5


class SigtermDump:
    """Calls ``dump(reason)`` once, the moment SIGTERM arrives (module docstring).

    Args:
        dump: writes the post-mortem dump (``Session.dump``); must not raise.
        on_unanswered: called from the thread when the main thread has not run a Python
            SIGTERM handler (:meth:`answered`) within :data:`MAIN_THREAD_GRACE_S` of the
            thread's dump; it may end the process.
    """

    def __init__(
        self,
        dump: Callable[[str], object],
        on_unanswered: Callable[[], object] | None = None,
    ) -> None:
        self._dump = dump
        self._on_unanswered = on_unanswered
        self._answered = threading.Event()
        self._lock = threading.RLock()  # the main thread may re-enter from a nested signal
        self._dumped = False
        self._watching = False
        self._displaced: Any = None

    @property
    def dumped(self) -> bool:
        """Whether the dump was written."""
        return self._dumped

    def answered(self) -> None:
        """The main thread is running a Python SIGTERM handler (it will act on the signal)."""
        self._answered.set()

    def dump_once(self, how: str) -> None:
        """Write the dump unless it was (waits while the other way writes it)."""
        with self._lock:
            if self._dumped:
                return
            self._dumped = True
            self._dump(f"signal SIGTERM ({how})")

    def watch(self) -> bool:
        """Start the wakeup-descriptor thread (idempotent); whether it watches."""
        if self._watching:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if previous != -1:  # someone else's descriptor: leave it in place
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return False
        threading.Thread(
            target=self._read, args=(read_fd,), name="stormwatch-sigterm-dump", daemon=True
        ).start()
        self._watching = True
        return True

    def _read(self, read_fd: int) -> None:
        while not self._dumped:
            try:
                received = os.read(read_fd, 64)
            except OSError:  # the descriptor is gone (interpreter shutdown): nothing to watch
                return
            if not received:
                return
            if signal.SIGTERM in received:
                self.dump_once("written from a thread at once")
        if self._on_unanswered is not None and not self._answered.wait(MAIN_THREAD_GRACE_S):
            self._on_unanswered()

    def forget_in_child(self) -> None:
        """In a forked child (``os.register_at_fork``): no wakeup descriptor (the child's
        signals would be written into the parent's pipe, its thread does not exist here),
        no dumps, and the handler :meth:`take_front` displaced back."""
        self._dumped = True  # nothing more is written from this process
        self._on_unanswered = None
        if threading.current_thread() is not threading.main_thread():
            return
        if self._watching:
            signal.set_wakeup_fd(-1)
            self._watching = False
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self._displaced)

    def take_front(self) -> bool:
        """Put :meth:`_handle` in front of the current SIGTERM handler (idempotent while it
        is in front); whether it is. Main thread only."""
        if threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(signal.SIGTERM)
        if current == self._handle:
            return True
        self._displaced = current
        signal.signal(signal.SIGTERM, self._handle)
        return True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.answered()
        self.dump_once("written before the other handlers")
        displaced = self._displaced
        if callable(displaced):
            displaced(signum, frame)
        elif displaced != signal.SIG_IGN:  # the default action: terminate with the signal
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


__all__ = ["MAIN_THREAD_GRACE_S", "SigtermDump"]
