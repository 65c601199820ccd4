"""Process inspection for the rank watcher: who is a torchrun agent, who is a rank.

The pure helpers that read ``/proc``, the environment and command lines; the rank
watcher (:mod:`.ranks`, which tracks rank lives) finds ranks with them
(:mod:`.discovery`), and re-checks one before a fault acts on it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from stormwatch.contracts.rank_env import RankKey, rank_env

_TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})


def is_torchrun_agent(name: str, cmdline: Sequence[str]) -> bool:
    """Whether a process is a torchrun (elastic agent) launcher.

    True for a process named ``torchrun``, a command line whose first or second
    word is a file named ``torchrun`` (``python /venv/bin/torchrun ...``), and
    ``python -m torch.distributed.run|launch``.
    """
    if name == "torchrun":
        return True
    if any(Path(arg).name == "torchrun" for arg in cmdline[:2]):
        return True
    for i, arg in enumerate(cmdline[:3]):
        if arg == "-m" and i + 1 < len(cmdline) and cmdline[i + 1] in _TORCHRUN_MODULES:
            return True
    return False


def metrics_dir_argument(cmdline: Sequence[str]) -> str | None:
    """The ``--metrics-dir D`` / ``--metrics-dir=D`` value given after a ``train`` word.

    ``stormwatch train --metrics-dir D`` (also under ``python -m stormwatch`` or
    a torchrun entry point) leaves ``STORMWATCH_METRICS_DIR`` unset: the folder
    is only on the command line. The last occurrence wins, as in click.
    """
    return train_option(cmdline, "--metrics-dir")


def train_option(cmdline: Sequence[str], option: str) -> str | None:
    """The value of ``option`` (``--log-dir``...) after a ``train`` word; the last wins."""
    try:
        start = list(cmdline).index("train") + 1
    except ValueError:
        return None
    found: str | None = None
    args = list(cmdline[start:])
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == option and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(option + "="):
            found = arg.split("=", 1)[1]
    return found or None


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``fields[0]`` is the
    state, field 3 of proc(5)); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:  # gone: no /proc entry left
        return None
    return data[data.rfind(b")") + 2 :].split()


def exit_status(pid: int) -> int | None:
    """Exit status of the zombie ``pid`` (``/proc/<pid>/stat`` field 52), None when unknown.

    Like ``subprocess``: the exit code, or ``-N`` for a death by signal N. Only a
    zombie has one; a reaped process has no ``/proc`` entry left.
    """
    fields = _stat_fields(pid)
    if fields is None:
        return None
    try:
        if fields[0] != b"Z":
            return None
        status = int(fields[49])
    except (IndexError, ValueError):
        return None
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


def rank_metrics_dir(
    environ: Mapping[str, str], cmdline: Sequence[str], cwd: str | None
) -> Path | None:
    """A rank's metrics folder, resolved: ``--metrics-dir`` after ``train`` on its
    command line (click: option over environment), else ``STORMWATCH_METRICS_DIR``;
    None when it has neither.

    A relative path is taken relative to the rank's working directory ``cwd``
    (None when unknown: the relative path is returned as is and matches no folder).
    """
    raw = metrics_dir_argument(cmdline) or environ.get("STORMWATCH_METRICS_DIR") or None
    if raw is None:
        return None
    path = Path(raw)
    if not path.is_absolute():
        if cwd is None:
            return path  # relative and unresolvable: matches no agent's (absolute) folder
        path = Path(cwd) / path
    return Path(os.path.realpath(path))


@dataclasses.dataclass(frozen=True)
class ProcEntry:
    """One process of the process table."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    create_time: float
    zombie: bool


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int, boot_time: float) -> tuple[int, bool, float] | None:
    """``(ppid, zombie, create time)`` of ``pid`` from ``/proc/<pid>/stat``; None when gone.

    The rank watcher lists every process twice a second; psutil would read this
    file twice per process and build objects for it, which costs most of a scan.
    The create time is computed as psutil computes it (boot time + start ticks),
    so it compares equal to ``psutil.Process.create_time()``.
    """
    fields = _stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[1]), fields[0] == b"Z", boot_time + int(fields[19]) / _CLOCK_TICKS
    except (IndexError, ValueError):
        return None


def same_time(a: float, b: float) -> bool:
    return abs(a - b) < 0.05


def pid_dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def process_cwd(pid: int) -> str | None:
    """Working directory of ``pid``; None when it cannot be read."""
    try:
        return psutil.Process(pid).cwd()
    except psutil.Error:
        return None


def read_rank_process(
    pid: int,
    create_time: float,
    key: RankKey,
    is_agent: Callable[[str, Sequence[str]], bool],
) -> tuple[Mapping[str, str], list[str], str | None] | str:
    """Fresh ``(environ, cmdline, cwd)`` of ``pid`` if it is still rank ``key``.

    Still rank ``key`` means: the same process (start time ``create_time``), not a
    zombie, a descendant of a torchrun agent (``is_agent``), whose environment
    says ``key``. Otherwise returns why not (one sentence, for a 404).
    """
    try:
        process = psutil.Process(pid)
        if not same_time(process.create_time(), create_time):
            return f"pid {pid} is now another process (start time changed)"
        if process.status() == psutil.STATUS_ZOMBIE:
            return f"pid {pid} has exited"
        environ = process.environ()
        cmdline = process.cmdline()
        cwd = process_cwd(pid)
        under_torchrun = any(is_agent(p.name(), p.cmdline()) for p in process.parents())
    except psutil.NoSuchProcess:
        return f"pid {pid} has exited"
    except psutil.Error as exc:
        return f"pid {pid} cannot be inspected ({type(exc).__name__})"
    env = rank_env(environ)
    if env is None or env.key != key:
        return f"pid {pid} is not rank {key[1]} of job {key[0]}"
    if not under_torchrun:
        return f"pid {pid} is not under a torchrun agent"
    return environ, cmdline, cwd


__all__ = [
    "ProcEntry",
    "exit_status",
    "is_torchrun_agent",
    "metrics_dir_argument",
    "pid_dead",
    "proc_stat",
    "process_cwd",
    "rank_metrics_dir",
    "read_rank_process",
    "same_time",
    "train_option",
]
