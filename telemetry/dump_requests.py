"""Post-mortem dumps on request: how the node agent reads a hung rank's flight recorder.

A rank that waits inside a collective runs no Python signal handler: CPython runs them
on the main thread between bytecodes, and a gloo or NCCL wait holds that thread in C++
(measured: a SIGTERM handler ran only once the all-reduce it interrupted returned).
So a hung job's ranks cannot be asked for their recorder with a signal. Instead each rank
polls a request file from a daemon thread, which can read PyTorch's flight recorder while
the main thread is blocked (``_dump_fr_trace_json`` needs no progress of the waiting one):

* request: ``<dump-dir>/rank<R>.request``, ``{"requested_at": UNIX_SECONDS, "reason": str}``
  (:class:`DumpRequest`), written atomically by the node agent when it detects a hang
  (:func:`write_request`);
* answer: the rank's dump ``<dump-dir>/rank<R>.attempt<A>.pid<P>.json``
  (:class:`~stormwatch.telemetry.dump.DumpRecord`, ``reason`` ``"requested: <reason>"``),
  once per request newer than the last one answered. A request older than the process
  (left from an earlier attempt) is not answered.

Every telemetry session with a dump folder answers (:func:`stormwatch.telemetry.init`
starts the watcher: the API, its integrations and ``stormwatch run`` alike).

A stopped or dead rank answers nothing: its silence, while its peers' dumps show them
waiting, is itself the evidence (:func:`stormwatch.postmortem.culprit_from_dumps`).
Polling costs one ``stat`` per :data:`POLL_SECONDS`. A request dated more than
:data:`MAX_FUTURE_SECONDS` ahead is ignored with a warning (answering it would silence
every later request until that time), and a request path that is not a regular file (a
FIFO, a device) is never read (opening a FIFO would block the thread). No torch import here.
"""

from __future__ import annotations

import logging
import os
import stat as stat_mode
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

log = logging.getLogger(__name__)

#: Seconds between two looks at the request file (the agent waits a few seconds for dumps).
POLL_SECONDS = 0.5
#: How far ahead of this host's clock a request may be dated: the agent and the rank share
#: a node's clock, so more than a minute ahead is a bad request, not skew.
MAX_FUTURE_SECONDS = 60.0


class DumpRequest(BaseModel):
    """One request for a rank's dump: when it was made (Unix s) and why."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    requested_at: float
    reason: str = ""


def request_path(dump_dir: Path, rank: int) -> Path:
    """``<dump_dir>/rank<rank>.request``."""
    return Path(dump_dir) / f"rank{rank}.request"


def write_request(dump_dir: Path, rank: int, reason: str, now: float) -> Path:
    """Ask rank ``rank`` for its dump (atomically: a temporary file renamed).

    Raises:
        OSError: the folder cannot be written.
    """
    path = request_path(dump_dir, rank)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(DumpRequest(requested_at=now, reason=reason).model_dump_json())
    os.replace(tmp, path)
    return path


def read_request(path: Path) -> DumpRequest | None:
    """The request in ``path``; None when there is none, it does not parse, or ``path`` is
    not a regular file (opened without blocking, so a FIFO never holds the reader)."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:  # none yet, or being replaced: looked at again soon
        return None
    try:
        if not stat_mode.S_ISREG(os.fstat(handle).st_mode):
            return None
        with os.fdopen(handle, "rb", closefd=False) as source:
            return DumpRequest.model_validate_json(source.read())
    except (OSError, ValidationError):  # being replaced, or not a request: looked at again
        return None
    finally:
        os.close(handle)


class DumpRequestWatcher:
    """Answers dump requests for one rank from a daemon thread; never raises.

    Args:
        dump_dir: the rank's dump folder.
        rank: its global rank.
        dump: writes the dump with the reason given (e.g.
            :meth:`stormwatch.telemetry.dump.RankDumper.dump`).
        started_at: Unix time before which requests are stale (default: now).
        interval: seconds between polls.
    """

    def __init__(
        self,
        dump_dir: Path,
        rank: int,
        dump: Callable[[str], object],
        *,
        started_at: float | None = None,
        interval: float = POLL_SECONDS,
    ) -> None:
        self._path = request_path(dump_dir, rank)
        self._dump = dump
        self._answered = time.time() if started_at is None else started_at
        self._interval = interval
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of the file last read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> bool:
        """Look once; answer a new request. Returns whether a dump was asked for."""
        try:
            stat = self._path.stat()
        except OSError:  # no request: the usual case
            return False
        if (stat.st_mtime_ns, stat.st_size) == self._seen:
            return False
        if not stat_mode.S_ISREG(stat.st_mode):
            self._seen = (stat.st_mtime_ns, stat.st_size)
            log.warning("dump request %s is not a regular file: not read", self._path)
            return False
        request = read_request(self._path)
        if request is None:
            return False
        self._seen = (stat.st_mtime_ns, stat.st_size)
        now = time.time()
        if request.requested_at > now + MAX_FUTURE_SECONDS:
            log.warning(
                "dump request %s is dated %.0f s ahead of this host's clock (more than %.0f "
                "s): ignored",
                self._path,
                request.requested_at - now,
                MAX_FUTURE_SECONDS,
            )
            return False
        if request.requested_at <= self._answered:
            return False
        self._answered = request.requested_at
        try:
            self._dump(f"requested: {request.reason}" if request.reason else "requested")
        except Exception:  # the dump's own failures are its to report; keep watching
            log.warning("dump request %s: the dump failed", self._path, exc_info=True)
        return True

    def start(self) -> None:
        """Poll every ``interval`` seconds on a daemon thread (it dies with the process)."""
        self._thread = threading.Thread(
            target=self._run, name="stormwatch-dump-requests", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.poll()


__all__ = [
    "MAX_FUTURE_SECONDS",
    "POLL_SECONDS",
    "DumpRequest",
    "DumpRequestWatcher",
    "read_request",
    "request_path",
    "write_request",
]
