"""Exit status of any process, from the Linux proc connector.

The agent is not the ranks' parent (torchrun is), so it cannot ``waitpid`` them,
and torchrun reaps a dead rank before a scan can read its zombie's status. The
kernel's *proc connector* (``NETLINK_CONNECTOR``, multicast group
``CN_IDX_PROC``; ``include/uapi/linux/cn_proc.h``) broadcasts a
``PROC_EVENT_EXIT`` for every process that exits, with its wait status
(``exit_code``: ``code << 8``, or the number of the signal that killed it), to
any listener (older kernels require ``CAP_NET_ADMIN``). Its pids are those of the
initial PID namespace, like the ones the rank watcher reads: the agent must run in
the host's PID namespace (``hostPID``), as it must anyway to see the ranks.

:class:`ProcConnector` listens on a background thread and remembers the last
:data:`KEEP` exits of thread-group leaders. It also counts every process created
(``PROC_EVENT_FORK`` of a new thread group), every ``exec`` (``PROC_EVENT_EXEC``)
and every exit (:meth:`~ExitSource.changes`): while the count stands still, the
process table is as the rank watcher last listed it, and its scan reuses that
listing (:class:`~.discovery.RankFinder`). A classic BPF filter on the socket drops
thread events and the other kinds in the kernel, so a busy host costs little. The
connector exists in the initial network namespace only; an agent started inside
another one (the lab's nodes) opens its socket from a short-lived thread that
joins the network namespace of PID 1 or of one of its own ancestors (``setns``,
needs ``CAP_SYS_ADMIN``); the socket keeps working after the thread ends.

When none of that works (no privileges, a kernel without ``CONFIG_PROC_EVENTS``,
a container in its own user and network namespaces), :func:`open_exit_source` logs why and returns an
:class:`UnavailableExits`: exit codes are then only known for ranks caught as
zombies (``/proc/<pid>/stat``), and ``stormwatch_proc_connector_up`` is 0.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import errno
import logging
import os
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_FORK = 0x00000001
PROC_EVENT_EXEC = 0x00000002
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
SO_ATTACH_FILTER = 26
CLONE_NEWNET = 0x40000000

#: Exits remembered (a rank's exit is looked up within a scan interval, 1 s, of it).
KEEP = 8192
#: Offsets in a connector message: nlmsghdr (16) + cn_msg (20) = proc_event.
_WHAT_OFFSET = 36
_EXIT_OFFSET = 52  # after what, cpu, timestamp_ns: pid, tgid, exit_code, exit_signal
#: A fork event's child: after parent_pid, parent_tgid: child_pid, child_tgid.
_CHILD_OFFSET = _EXIT_OFFSET + 8


@dataclasses.dataclass(frozen=True)
class ProcessExit:
    """One process exit.

    Attributes:
        pid: the process (thread-group leader).
        status: the wait status (``os.waitstatus_to_exitcode`` input).
        at: Unix time at which the agent received the event.
    """

    pid: int
    status: int
    at: float

    @property
    def code(self) -> int | None:
        """Exit code 0..255, None when a signal killed it."""
        return None if self.status & 0x7F else (self.status >> 8) & 0xFF

    @property
    def signal(self) -> int | None:
        """Number of the signal that killed it, None after a normal exit."""
        return self.status & 0x7F or None

    @property
    def returncode(self) -> int:
        """Like ``subprocess``: the exit code, or minus the signal number."""
        return -self.signal if self.signal else (self.code or 0)


def signal_name(number: int) -> str:
    """``9`` -> ``SIGKILL``; ``SIG<n>`` for numbers without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


class ExitSource(Protocol):
    """Where exit statuses of processes that are not the agent's children come from."""

    @property
    def available(self) -> bool:
        """Whether exits are being received."""
        ...

    @property
    def reason(self) -> str | None:
        """Why not (None while available)."""
        ...

    def lookup(self, pid: int, *, since: float, wait: float = 0.0) -> ProcessExit | None:
        """The exit of ``pid`` received at or after ``since`` (Unix s), waiting up to
        ``wait`` seconds for it to arrive; None when unknown."""
        ...

    def on_exit(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(pid)`` for every exit received from now on (on the receiving
        thread, at once; it must be quick and must not raise)."""
        ...

    def changes(self) -> int | None:
        """A count of the process events received so far (a process created, an ``exec``,
        an exit; also a burst of events lost), or None when it cannot be known: while it
        stays the same, no process was created, replaced its program or ended."""
        ...

    def close(self) -> None:
        """Stop listening."""
        ...


class UnavailableExits:
    """An :class:`ExitSource` that knows nothing (the proc connector is unusable)."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    @property
    def available(self) -> bool:
        return False

    @property
    def reason(self) -> str | None:
        return self._reason

    def lookup(self, pid: int, *, since: float, wait: float = 0.0) -> ProcessExit | None:
        return None

    def on_exit(self, listener: Callable[[int], None]) -> None:
        return None  # nothing is received: the listener is never called

    def changes(self) -> int | None:
        return None

    def close(self) -> None:
        return None


def _exit_filter() -> bytes:
    """Classic BPF: keep ``PROC_EVENT_EXIT`` of thread-group leaders (pid == tgid), every
    ``PROC_EVENT_EXEC``, and ``PROC_EVENT_FORK`` of a new process (child pid == child tgid,
    not a new thread); drop the rest (``include/uapi/linux/cn_proc.h``).

    Socket-filter loads are big-endian; the connector's fields are host-endian,
    hence the swapped constants.
    """

    def swapped(value: int) -> int:
        return int(struct.unpack(">I", struct.pack("=I", value))[0])

    ld_abs, tax, ret_k, ja = 0x20, 0x07, 0x06, 0x05
    jeq_k, jeq_x = 0x15, 0x1D
    program = [  # (code, jump if true, jump if false, k): jumps count from the next one
        (ld_abs, 0, 0, _WHAT_OFFSET),  # 0
        (jeq_k, 11, 0, swapped(PROC_EVENT_EXEC)),  # 1: an exec -> keep (13)
        (jeq_k, 0, 4, swapped(PROC_EVENT_EXIT)),  # 2: neither exit (3) nor exec -> 7
        (ld_abs, 0, 0, _EXIT_OFFSET),  # 3: pid
        (tax, 0, 0, 0),  # 4
        (ld_abs, 0, 0, _EXIT_OFFSET + 4),  # 5: tgid
        (ja, 0, 0, 4),  # 6: -> 11
        (jeq_k, 0, 4, swapped(PROC_EVENT_FORK)),  # 7: not a fork -> drop (12)
        (ld_abs, 0, 0, _CHILD_OFFSET),  # 8: child pid
        (tax, 0, 0, 0),  # 9
        (ld_abs, 0, 0, _CHILD_OFFSET + 4),  # 10: child tgid
        (jeq_x, 1, 0, 0),  # 11: a thread -> drop (12), else keep (13)
        (ret_k, 0, 0, 0),  # 12: drop
        (ret_k, 0, 0, 0xFFFF),  # 13: keep
    ]
    return b"".join(struct.pack("HBBI", *insn) for insn in program)


def _listen_message() -> bytes:
    op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
    cn_msg = struct.pack("=IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
    return struct.pack("=IHHII", 16 + len(cn_msg), NLMSG_DONE, 0, 0, 0) + cn_msg


def _open_here() -> socket.socket:
    """A connector socket subscribed to process events, in this thread's network namespace.

    Raises:
        OSError: no connector here (``ECONNREFUSED``), no ``CAP_NET_ADMIN`` (``EPERM``)...
    """
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    try:
        program = _exit_filter()
        buffer = ctypes.create_string_buffer(program)
        fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buffer))
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        sock.bind((0, CN_IDX_PROC))
        sock.send(_listen_message())
    except BaseException:
        sock.close()
        raise
    return sock


def _foreign_netns_pids() -> list[int]:
    """PID 1, PID 2, then this process's ancestors: processes whose network namespace may
    be the initial one. PID 2 is ``kthreadd`` in the host's PID namespace (kernel threads
    live in the initial network namespace), and stays readable where PID 1 is not (an
    init with its own restrictions); the ancestors cover ``ip netns exec`` started from a
    process outside, as long as it has not been re-parented."""
    try:
        own = os.readlink("/proc/self/ns/net")
    except OSError:
        return []
    pids, pid = [1, 2], os.getppid()
    while pid > 1 and pid not in pids:
        pids.append(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                pid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    found = []
    for candidate in pids:
        try:
            if os.readlink(f"/proc/{candidate}/ns/net") != own:
                found.append(candidate)
        except OSError:
            continue
    return found


def _open_in_other_netns() -> socket.socket:
    """:func:`_open_here`, from a thread that joined another process's network
    namespace (:func:`_foreign_netns_pids`, first that works).

    Raises:
        OSError: no such namespace can be joined (``EPERM``) or none has a connector.
    """
    result: list[socket.socket | BaseException] = []

    def work() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        last: OSError = OSError(errno.ECONNREFUSED, "no proc connector in this network namespace")
        for pid in _foreign_netns_pids():
            try:
                fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            except OSError as exc:
                last = exc
                continue
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    last = OSError(err, os.strerror(err))
                    continue
            finally:
                os.close(fd)
            try:
                result.append(_open_here())
                return
            except OSError as exc:
                last = exc
        result.append(last)

    # The thread ends in the other namespace; no other thread of the agent moves.
    thread = threading.Thread(target=work, name="stormwatch-proc-connector-open")
    thread.start()
    thread.join()
    outcome = result[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


class ProcConnector:
    """Receives ``PROC_EVENT_EXIT`` (and counts forks and execs) on a background thread
    (see the module docstring).

    Raises (from the constructor):
        OSError: the connector cannot be subscribed to, here or in PID 1's namespace.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        try:
            self._sock = _open_here()
        except OSError as exc:
            if exc.errno != errno.ECONNREFUSED:  # no connector in this network namespace
                raise
            self._sock = _open_in_other_netns()
        self._sock.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()  # close() wakes the reader at once
        self._cond = threading.Condition()
        self._exits: collections.OrderedDict[int, ProcessExit] = collections.OrderedDict()
        self._stop = threading.Event()
        self._reason: str | None = None
        self._listeners: list[Callable[[int], None]] = []
        self._changes = 0  # written by the receiving thread only
        self._thread = threading.Thread(
            target=self._run, name="stormwatch-proc-connector", daemon=True
        )
        self._thread.start()

    @property
    def available(self) -> bool:
        return self._reason is None

    @property
    def reason(self) -> str | None:
        return self._reason

    def lookup(self, pid: int, *, since: float, wait: float = 0.0) -> ProcessExit | None:
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                found = self._exits.get(pid)
                if found is not None and found.at >= since:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or not self.available:
                    return None
                self._cond.wait(left)

    def on_exit(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    def changes(self) -> int | None:
        return self._changes if self.available and not self._stop.is_set() else None

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(2.0)
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        try:
            self._receive()
        except Exception as exc:  # the count must not stand still behind a dead thread
            if self._stop.is_set():
                return
            self._reason = f"receiving failed: {exc!r}"
            log.warning("proc connector stopped: %r; exit codes now unknown", exc, exc_info=True)
            with self._cond:
                self._cond.notify_all()

    def _receive(self) -> None:
        # poll, not select: select refuses a descriptor number of 1024 or more
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                return
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                if exc.errno == errno.ENOBUFS:  # a burst overflowed the socket: some lost
                    log.debug("proc connector: events lost (ENOBUFS)")
                    self._changes += 1  # what was lost may have changed the process table
                    continue
                raise
            self._parse(data)

    def _parse(self, data: bytes) -> None:
        offset = 0
        while offset + 16 <= len(data):
            length = struct.unpack_from("=I", data, offset)[0]
            if length < 16:
                return
            message = data[offset : offset + length]
            offset += (length + 3) & ~3
            if len(message) < _EXIT_OFFSET + 16:
                continue
            what = struct.unpack_from("=I", message, _WHAT_OFFSET)[0]
            if what in (PROC_EVENT_FORK, PROC_EVENT_EXEC):  # the filter kept new processes
                self._changes += 1
                continue
            if what != PROC_EVENT_EXIT:
                continue
            pid, tgid, status, _ = struct.unpack_from("=IIII", message, _EXIT_OFFSET)
            if pid != tgid:
                continue
            self._changes += 1
            event = ProcessExit(pid=pid, status=status, at=self._clock())
            with self._cond:
                self._exits.pop(pid, None)
                self._exits[pid] = event
                while len(self._exits) > KEEP:
                    self._exits.popitem(last=False)
                self._cond.notify_all()
            for listener in self._listeners:
                try:
                    listener(pid)
                except Exception:  # a failing listener must not stop exits being received
                    log.warning("proc connector: an exit listener failed", exc_info=True)


def open_exit_source(*, clock: Callable[[], float] = time.time) -> ExitSource:
    """A :class:`ProcConnector`, or an :class:`UnavailableExits` saying why (logged once)."""
    try:
        return ProcConnector(clock=clock)
    except OSError as exc:
        hint = (
            " (needs CAP_NET_ADMIN on older kernels, and CAP_SYS_ADMIN to leave a network "
            "namespace)"
            if exc.errno in (errno.EPERM, errno.EACCES)
            else ""
        )
        reason = f"proc connector unavailable: {exc.strerror or exc}{hint}"
        log.warning("%s; rank exit codes are only known for ranks seen as zombies", reason)
        return UnavailableExits(reason)


__all__ = [
    "KEEP",
    "ExitSource",
    "ProcConnector",
    "ProcessExit",
    "UnavailableExits",
    "open_exit_source",
    "signal_name",
]
