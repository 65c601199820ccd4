"""Detached supervisor for one lab process (run as a script; standard library only).

Usage::

    python supervise.py --status FILE --log FILE [--cwd DIR] [--grace S] -- CMD [ARGS...]

The process started by the lab (the *launcher*) forks a daemon and exits as
soon as the daemon has started ``CMD``, printing ``{"pid": ..., "supervisor_pid": ...}``
on stdout. So the lab never owns a long-running child (no zombies, no
``ResourceWarning`` for an unreaped ``Popen``) and ``lab up`` can exit while its
services keep running.

The daemon:

* starts a new session, makes itself a child subreaper (PR_SET_CHILD_SUBREAPER),
  so that grandchildren orphaned by a killed ``CMD`` (torchrun's workers) are
  re-parented to it instead of to init;
* runs ``CMD`` with stdout and stderr appended to ``--log``;
* forwards SIGTERM, SIGINT and SIGHUP to ``CMD``;
* when ``CMD`` exits, terminates whatever it left behind (SIGTERM, then SIGKILL
  after ``--grace`` seconds), then writes the status file
  ``{"pid", "supervisor_pid", "started_at", "returncode", "ended_at"}``
  (``returncode`` negative when killed by that signal, like :mod:`subprocess`)
  and exits.

It is a script rather than a module of the package so that it starts in tens of
milliseconds without importing pydantic, aiohttp or torch.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _write_status(path: str, status: dict[str, object]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(status, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc, so no third-party import is needed)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name (field 2) may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _reap(deadline: float) -> None:
    """Reap children until none is left or ``deadline`` passes (polling, 50 ms)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)


def _kill_leftovers(grace: float) -> None:
    """SIGTERM every remaining child (adopted orphans), SIGKILL after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        pids = _children(os.getpid())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # exited already: nothing to signal
                os.kill(pid, sig)
        _reap(time.monotonic() + wait)


def _daemon(args: argparse.Namespace, report_fd: int) -> int:
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # best effort: sweeps cover its absence
    log_fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    if args.cwd:
        os.chdir(args.cwd)

    pending: list[int] = []
    child_pid = 0

    def forward(signum: int, _frame: object) -> None:
        if child_pid:
            with contextlib.suppress(ProcessLookupError):  # exited already: nothing to forward to
                os.kill(child_pid, signum)
        else:
            pending.append(signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)

    started_at = time.time()
    try:
        child_pid = os.posix_spawnp(
            args.cmd[0],
            args.cmd,
            os.environ,
            setsigdef=_FORWARDED,
        )
    except OSError as exc:
        message = f"cannot execute {args.cmd[0]!r}: {exc.strerror}"
        print(f"supervise: {message}", flush=True)
        os.write(report_fd, f"error {message}\n".encode())
        os.close(report_fd)
        return 127
    status: dict[str, object] = {
        "pid": child_pid,
        "supervisor_pid": os.getpid(),
        "started_at": started_at,
        "returncode": None,
        "ended_at": None,
    }
    _write_status(args.status, status)
    os.write(report_fd, f"ok {json.dumps(status)}\n".encode())
    os.close(report_fd)
    for signum in pending:
        os.kill(child_pid, signum)

    while True:
        pid, wait_status = os.waitpid(-1, 0)  # also reaps adopted orphans
        if pid == child_pid:
            returncode = os.waitstatus_to_exitcode(wait_status)
            break
    _kill_leftovers(args.grace)
    status.update(returncode=returncode, ended_at=time.time())
    _write_status(args.status, status)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--status", required=True, help="JSON status file to write")
    parser.add_argument("--log", required=True, help="file that gets the command's output")
    parser.add_argument("--cwd", default=None, help="working directory of the command")
    parser.add_argument(
        "--grace", type=float, default=5.0, help="seconds leftovers get after SIGTERM"
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = parser.parse_args(argv)
    if args.cmd and args.cmd[0] == "--":
        args.cmd = args.cmd[1:]
    if not args.cmd:
        parser.error("no command given after --")

    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        os.close(read_fd)
        code = 1
        try:
            code = _daemon(args, write_fd)
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as report:
        line = report.readline().strip()
    if line.startswith("ok "):
        print(line[3:], flush=True)
        return 0
    print(
        line.removeprefix("error ") or "supervisor died before starting the command",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
