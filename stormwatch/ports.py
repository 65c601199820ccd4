"""Ports: one home for binding them and for telling a port conflict from other failures.

A port chosen by reading the listening sockets, or by binding and releasing it, can be
taken by another process before its user binds it (and a restart that relaunches on the
port its previous processes held races their exit). So a bind is *retried*:
:func:`retry_bind` calls the bind again while it fails with a port conflict, with
bounded exponential backoff (:class:`Backoff`), and raises
:class:`~stormwatch.errors.PortConflictError` when the port stayed taken; any other
failure passes at once. Relaunching on a port first waits until the processes that held
it are gone (:func:`stormwatch.platforms.stopping.stop_processes` confirms that).

A conflict is recognised structurally: an :class:`OSError` with ``errno`` ``EADDRINUSE``
anywhere in the exception's cause chain (:func:`is_port_conflict`). Exceptions that carry
no errno (torch's ``DistNetworkError`` from a ``TCPStore`` that cannot listen) and log
lines are matched by :func:`says_port_conflict`, case-insensitively on the errno's name
and the C library's text (``EADDRINUSE``, ``Address already in use``, ``code: -98``).
"""

from __future__ import annotations

import errno
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from stormwatch.errors import ConfigError, PortConflictError, cause_chain

T = TypeVar("T")

#: The words of a port conflict in text: the errno's name, strerror(EADDRINUSE) and
#: the negative errno torch's c10d prints (``code: -98``); case-insensitive.
_CONFLICT_TEXT = re.compile(
    rf"\beaddrinuse\b|address already in use|code:\s*-{errno.EADDRINUSE}\b", re.IGNORECASE
)


def says_port_conflict(text: str) -> bool:
    """Whether ``text`` (an error message, a log line) reports a port conflict."""
    return bool(_CONFLICT_TEXT.search(text))


#: The errno torch's c10d writes into an errno-less ``DistNetworkError``: ``code: -98,
#: name: EADDRINUSE`` (both: "exit code: -11" of a signalled process is no errno).
_C10D_CODE = re.compile(r"\bcode: -(\d+), name: E[A-Z0-9]+\b")


def error_errno(error: BaseException) -> int | None:
    """The errno of the system call behind ``error``: the first ``OSError`` with one in its
    cause chain, else the ``code: -N`` torch's c10d writes into an errno-less error (a
    ``DistNetworkError`` of a store that cannot listen: ``code: -98, name: EADDRINUSE``);
    None when neither. ``raise ... from None`` hides the context, as in a traceback.
    Compare it with :mod:`errno`'s names (``errno.EADDRINUSE``), never the message."""
    for current in cause_chain(error):
        if isinstance(current, OSError) and current.errno is not None:
            return int(current.errno)
        found = _C10D_CODE.search(str(current))
        if found is not None:
            return int(found.group(1))
    return None


def is_port_conflict(error: BaseException) -> bool:
    """Whether ``error`` (or an exception it was raised from) is a port conflict: an
    ``OSError`` with errno ``EADDRINUSE``, else an errno-less error whose message says so
    (:func:`says_port_conflict`)."""
    for current in cause_chain(error):
        if isinstance(current, OSError) and current.errno is not None:
            if current.errno == errno.EADDRINUSE:
                return True
        elif says_port_conflict(str(current)):
            return True
    return False


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """How :func:`retry_bind` waits between tries.

    Attributes:
        attempts: tries in all (>= 1). Default 6.
        first_delay_s: wait after the first conflict; doubled after each. Default 0.2 s.
        max_delay_s: the longest single wait. Default 2 s: the defaults wait at most
            0.2 + 0.4 + 0.8 + 1.6 + 2 = 5 s, longer than a stopped process takes to leave
            its socket (the kernel frees a listener at close; TIME_WAIT does not block a
            listener bound with ``SO_REUSEADDR``).
    """

    attempts: int = 6
    first_delay_s: float = 0.2
    max_delay_s: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"Backoff.attempts: must be >= 1 (got {self.attempts!r})")
        if not (self.first_delay_s >= 0 and self.max_delay_s >= self.first_delay_s):
            raise ConfigError(
                "Backoff: need 0 <= first_delay_s <= max_delay_s "
                f"(got {self.first_delay_s!r}, {self.max_delay_s!r})"
            )

    def delays(self) -> list[float]:
        """The waits between the tries (``attempts - 1`` of them)."""
        return [min(self.first_delay_s * 2**i, self.max_delay_s) for i in range(self.attempts - 1)]


def retry_bind(
    bind: Callable[[], T],
    *,
    what: str,
    port: int | None = None,
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``bind()``'s result, calling it again after each port conflict (:func:`is_port_conflict`)
    with :class:`Backoff`'s waits.

    Args:
        bind: binds (a socket, a store, a server) or raises.
        what: named in the error (``"rendezvous store 10.0.0.1:29500"``).
        port: the port, for the error.

    Raises:
        PortConflictError: the port was still in use at the last try (from its error).
        Exception: any other failure of ``bind``, at once.
    """
    plan = backoff or Backoff()
    delays = plan.delays()
    for attempt in range(plan.attempts):
        try:
            return bind()
        except Exception as exc:
            if not is_port_conflict(exc):
                raise
            if attempt == plan.attempts - 1:
                raise PortConflictError(
                    f"{what}: port {port if port is not None else '?'} still in use after "
                    f"{plan.attempts} tries over {sum(delays):g} s ({exc}); stop what holds it "
                    "or choose another port",
                    port=port,
                ) from exc
            sleep(delays[attempt])
    raise AssertionError("unreachable")  # pragma: no cover


def bind_listener(host: str, port: int, *, backoff: Backoff | None = None) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``SO_REUSEADDR``, as Go's listeners and torch's
    ``TCPStore`` do), retried while the port is in use; the caller listens and closes it."""

    def bind() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except BaseException:
            sock.close()
            raise
        return sock

    return retry_bind(bind, what=f"listener {host}:{port}", port=port, backoff=backoff)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind ``host:port`` now (``SO_REUSEADDR``); only a hint
    for a message: another process may take it next, so binders use :func:`retry_bind`."""
    try:
        bind_listener(host, port, backoff=Backoff(attempts=1)).close()
    except PortConflictError:
        return False
    return True


__all__ = [
    "Backoff",
    "bind_listener",
    "error_errno",
    "is_port_conflict",
    "port_is_free",
    "retry_bind",
    "says_port_conflict",
]
