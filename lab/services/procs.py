"""Start, inspect and stop the lab's long-running processes.

Every process runs behind ``supervise.py`` (see there): the lab starts it
detached, learns its pid, and later reads its exit status from a status file.
A pid is only trusted together with its start time (:class:`ProcessRecord`), so
a recycled pid is never signalled. Sweeps find processes a crashed ``lab up``
could not record: those inside the lab's namespaces and those whose environment
carries the lab's marker (:data:`LAB_MARKER_ENV`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from stormwatch.lab.errors import LabError
from stormwatch.lab.state import ProcessRecord
from stormwatch.platforms.errors import NotStopped
from stormwatch.platforms.stopping import stop_processes

SUPERVISOR = Path(__file__).with_name("supervise.py")
#: Environment variable naming the run directory, set on every process the lab starts.
LAB_MARKER_ENV = "STORMWATCH_LAB_RUN_DIR"
#: Seconds a lab service gets between SIGTERM and SIGKILL (Prometheus flushes its head
#: block in well under a second); a job's stops use the lab's ``grace_period_s``.
DEFAULT_GRACE = 5.0


@dataclass(frozen=True)
class ExitStatus:
    """What a supervisor recorded: ``returncode`` is ``None`` while the process runs."""

    returncode: int | None
    ended_at: float | None


def launch(
    name: str,
    cmd: Sequence[str],
    *,
    log_file: Path,
    status_file: Path,
    env: Mapping[str, str] | None = None,
    netns: str | None = None,
    cwd: Path | None = None,
    timeout: float = 30.0,
) -> ProcessRecord:
    """Start ``cmd`` detached behind a supervisor, optionally inside network namespace ``netns``.

    Returns once the command has been executed (not once it is healthy).

    Raises:
        LabError: the command could not be executed (names it and why).
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    status_file.parent.mkdir(parents=True, exist_ok=True)
    status_file.unlink(missing_ok=True)
    with open(log_file, "a") as fh:
        fh.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {name}: {' '.join(cmd)}\n")
    argv = [sys.executable, str(SUPERVISOR), "--status", str(status_file), "--log", str(log_file)]
    if cwd is not None:
        argv += ["--cwd", str(cwd)]
    argv += ["--", *cmd]
    if netns is not None:
        argv = ["ip", "netns", "exec", netns, *argv]
    try:
        out = subprocess.run(
            argv,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"could not start {name}: {exc}") from exc
    if out.returncode != 0:
        raise LabError(f"could not start {name}: {out.stderr.strip() or out.stdout.strip()}")
    started = json.loads(out.stdout)
    return ProcessRecord(
        name=name,
        pid=started["pid"],
        create_time=_create_time(started["pid"]),
        supervisor_pid=started["supervisor_pid"],
        supervisor_create_time=_create_time(started["supervisor_pid"]),
        cmd=list(cmd),
        log_file=log_file,
        status_file=status_file,
        netns=netns,
        started_at=started["started_at"],
    )


def _create_time(pid: int) -> float:
    # 0.0 never matches a real process: a command that exited at once is never signalled.
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def _verified(pid: int, create_time: float) -> psutil.Process | None:
    """The process ``pid`` if it is still the one started at ``create_time`` and not a zombie."""
    try:
        proc = psutil.Process(pid)
        if proc.create_time() != create_time or proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return proc


def exit_status(record: ProcessRecord) -> ExitStatus:
    """The recorded exit status; ``returncode`` ``None`` while running or when unknown."""
    try:
        data = json.loads(record.status_file.read_text())
    except (OSError, ValueError):
        return ExitStatus(None, None)
    return ExitStatus(data.get("returncode"), data.get("ended_at"))


def is_running(record: ProcessRecord) -> bool:
    """Whether the command (not just its supervisor) is still running."""
    return _verified(record.pid, record.create_time) is not None


def is_finished(record: ProcessRecord) -> bool:
    """Whether the supervisor is gone (it exits after recording the exit status)."""
    return _verified(record.supervisor_pid, record.supervisor_create_time) is None and not (
        is_running(record)
    )


def tree(record: ProcessRecord) -> list[psutil.Process]:
    """The supervisor, the command and all their descendants that are still alive."""
    found: dict[int, psutil.Process] = {}
    for pid, ctime in (
        (record.supervisor_pid, record.supervisor_create_time),
        (record.pid, record.create_time),
    ):
        root = _verified(pid, ctime)
        if root is None:
            continue
        found[root.pid] = root
        try:
            for child in root.children(recursive=True):
                found[child.pid] = child
        except psutil.Error:  # it exited while its children were listed: they are orphans now
            pass
    return list(found.values())


def namespace_processes(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes among ``pids`` (e.g. from ``ip netns pids``) that still exist."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return procs


def marker_of(proc: psutil.Process) -> str | None:
    """The run directory in ``proc``'s :data:`LAB_MARKER_ENV` (``None``: unmarked or unreadable)."""
    try:
        return proc.environ().get(LAB_MARKER_ENV)
    except psutil.Error:
        return None


def processes_marked(run_dir: Path) -> list[psutil.Process]:
    """Processes (other than this one and its ancestors) started for the lab in ``run_dir``.

    Every process the lab starts, and everything they start (torchrun's workers),
    carries ``STORMWATCH_LAB_RUN_DIR=<run_dir>`` in its environment; this finds
    them even when ``lab up`` was killed before it could record their pids.
    """
    spare = {os.getpid()}
    with contextlib.suppress(psutil.Error):  # a parent gone meanwhile cannot be swept either
        spare.update(p.pid for p in psutil.Process().parents())
    wanted = str(run_dir)
    found = []
    for proc in psutil.process_iter():
        if proc.pid in spare:
            continue
        try:
            if proc.environ().get(LAB_MARKER_ENV) == wanted:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def terminate(procs: Iterable[psutil.Process], grace: float = DEFAULT_GRACE) -> list[str]:
    """SIGTERM ``procs`` together, SIGKILL those alive after ``grace`` seconds (0: at once),
    then wait until they are gone (:func:`stormwatch.platforms.stopping.stop_processes`).

    Returns:
        Descriptions of processes that survived SIGKILL (should be empty).

    Raises:
        LabError: not allowed to signal one of them.
    """
    try:
        stopped = stop_processes(procs, grace_s=grace)
    except NotStopped as exc:
        raise LabError(str(exc)) from exc
    return [f"pid {pid}" for pid in stopped.left]


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file ('' when unreadable), for error messages."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


__all__ = [
    "DEFAULT_GRACE",
    "LAB_MARKER_ENV",
    "SUPERVISOR",
    "ExitStatus",
    "exit_status",
    "is_finished",
    "is_running",
    "launch",
    "log_tail",
    "marker_of",
    "namespace_processes",
    "processes_marked",
    "terminate",
    "tree",
]
