"""Port conflicts are retried with backoff by errno, never fatal at the first try, and told
from other failures structurally (real sockets and processes)."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stormwatch.errors import PortConflictError
from stormwatch.lab.jobs.launch import failure_lines
from stormwatch.ports import (
    Backoff,
    bind_listener,
    is_port_conflict,
    retry_bind,
    says_port_conflict,
)

HOLD = """
import socket, sys, time
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
print(sock.getsockname()[1], flush=True)
time.sleep(float(sys.argv[1]))
"""


def _holder(seconds: float) -> tuple[subprocess.Popen[str], int]:
    """Another process listening on a port for ``seconds`` (it exits then)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def _end(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


def test_a_port_held_by_a_process_that_exits_is_bound_after_retries() -> None:
    process, port = _holder(1.0)
    try:
        sock = bind_listener("127.0.0.1", port, backoff=Backoff(attempts=8, max_delay_s=0.5))
        sock.close()
        assert process.poll() == 0  # bound only once the holder had gone
    finally:
        _end(process)


def test_a_port_that_stays_taken_raises_a_port_conflict_after_bounded_tries() -> None:
    process, port = _holder(60.0)
    try:
        with pytest.raises(PortConflictError) as raised:
            bind_listener("127.0.0.1", port, backoff=Backoff(attempts=4, first_delay_s=0.01))
    finally:
        _end(process)
    assert raised.value.port == port
    assert isinstance(raised.value.__cause__, OSError)
    assert raised.value.__cause__.errno == errno.EADDRINUSE


def test_another_bind_failure_is_not_retried() -> None:
    tries = 0

    def bind() -> None:
        nonlocal tries
        tries += 1
        with socket.socket() as sock:
            sock.bind(("192.0.2.1", 0))  # TEST-NET-1: not an address of this host

    with pytest.raises(OSError) as raised:
        retry_bind(bind, what="test", backoff=Backoff(attempts=5, first_delay_s=0.01))
    assert raised.value.errno == errno.EADDRNOTAVAIL
    assert tries == 1


def test_conflicts_are_told_by_errno_and_by_text_in_any_case() -> None:
    process, port = _holder(30.0)
    try:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError as exc:
                real = exc
    finally:
        _end(process)
    assert is_port_conflict(real)
    wrapped = RuntimeError("the store could not start")
    wrapped.__cause__ = real
    assert is_port_conflict(wrapped)
    # torch's DistNetworkError carries no errno: its text, whatever the case
    torch_text = (
        "The server socket has failed to listen on any local network address. port: 29500, "
        "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    )
    assert is_port_conflict(RuntimeError(torch_text))
    assert says_port_conflict("OSError: [Errno 98] Address Already In Use")
    assert says_port_conflict("bind failed: eaddrinuse")
    assert not says_port_conflict("connection refused (code: -111)")
    assert not is_port_conflict(OSError(errno.ECONNREFUSED, "Address already in use?"))


def test_a_torchrun_log_with_a_port_conflict_in_any_case_names_it(tmp_path: Path) -> None:
    log = tmp_path / "node0.torchrun.log"
    log.write_text("starting\nsome noise\n[W] bind: address ALREADY in use (port 29500)\nbye\n")
    assert failure_lines(log, limit=1) == ["[W] bind: address ALREADY in use (port 29500)"]
