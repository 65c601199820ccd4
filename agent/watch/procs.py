"""Process inspection for the rank watcher: who is a rank launcher, who is a rank.

The pure helpers that read ``/proc``, the environment and command lines; the rank
watcher (:mod:`.ranks`, which tracks rank lives) finds ranks with them
(:mod:`.discovery`), and re-checks one before a fault acts on it. Who launches ranks
(:func:`is_rank_launcher`: torchrun, or ``slurmstepd`` for the Slurm tasks ``stormwatch
run`` marks) is the rank-environment contract's (:mod:`stormwatch.contracts.rank_env`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import psutil

from stormwatch.contracts.rank_env import RankKey, is_rank_launcher, is_torchrun_agent, rank_env


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


def _stat(pid: int) -> tuple[bytes, list[bytes]] | None:
    """The command name (``comm``, field 2 of proc(5)) of ``pid`` and the fields of
    ``/proc/<pid>/stat`` after it (``fields[0]`` is the state, field 3); None when gone."""
    # os.open/os.read rather than open(): a scan reads this file for every process every
    # second, and the buffered file object cost two thirds of each read. The line is
    # bounded (``comm`` is at most 16 bytes), so one read of 4 KiB holds all of it.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:  # gone: no /proc entry left
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:  # gone between the open and the read
        return None
    finally:
        os.close(fd)
    end = data.rfind(b")")
    return data[data.find(b"(") + 1 : end], data[end + 2 :].split()


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``fields[0]`` is the
    state, field 3 of proc(5)); None when the process is gone."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


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
    """One process of the process table (``comm``: the kernel's command name, which
    ``exec`` changes)."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    create_time: float
    zombie: bool
    comm: str = ""
    image: int = 0

    @property
    def key(self) -> tuple[int, float, str, int]:
        """One program run by one process: ``exec`` keeps the pid and start time but
        replaces the command line and environment. It changes the command name
        (``stormwatch run`` becoming ``torchrun``), but not always (``python -m stormwatch
        run -- python train.py`` stays ``python``), so ``image`` (where the environment
        starts in memory, which every ``exec`` places afresh) is part of the key too."""
        return (self.pid, self.create_time, self.comm, self.image)


class ProcStat(NamedTuple):
    """What one read of ``/proc/<pid>/stat`` says (:func:`proc_stat`)."""

    ppid: int
    zombie: bool
    create_time: float
    comm: str
    #: ``env_start`` (field 50 of proc(5)): changes at every ``exec``; 0 when unreadable.
    image: int


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int, boot_time: float) -> ProcStat | None:
    """Parent, zombie state, create time, command name and image of ``pid`` from
    ``/proc/<pid>/stat``; None when gone.

    The rank watcher lists every process every second; psutil would read this
    file twice per process and build objects for it, which costs most of a scan.
    The create time is computed as psutil computes it (boot time + start ticks),
    so it compares equal to ``psutil.Process.create_time()``.
    """
    stat = _stat(pid)
    if stat is None:
        return None
    comm, fields = stat
    try:
        started = boot_time + int(fields[19]) / _CLOCK_TICKS
        image = int(fields[47]) if len(fields) > 47 else 0
        return ProcStat(
            int(fields[1]), fields[0] == b"Z", started, comm.decode(errors="replace"), image
        )
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


def nested_pids() -> frozenset[int]:
    """The pids that processes have inside nested PID namespaces (containers, pods): every
    entry of ``NSpid`` in ``/proc/<pid>/status`` after the first (proc(5)).

    A rank in a pod names its multiprocess files by its pid *there*, which the agent (in
    the host's namespace) cannot tell from a host pid: such a file's writer is taken for
    exited only when no process has that pid in any namespace.
    """
    found: set[int] = set()
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/status", "rb") as handle:
                for line in handle:
                    if line.startswith(b"NSpid:"):
                        found.update(int(x) for x in line.split()[2:])
                        break
        except (OSError, ValueError):
            continue  # gone since the listing, or unreadable: no nested pid to add
    return frozenset(found)


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
    zombie, a descendant of a rank launcher (``is_agent``), not a launcher itself,
    whose environment says ``key``. Otherwise returns why not (one sentence, for a 404).
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
        under_launcher = any(is_agent(p.name(), p.cmdline()) for p in process.parents())
        launcher = is_agent(process.name(), cmdline)
    except psutil.NoSuchProcess:
        return f"pid {pid} has exited"
    except psutil.Error as exc:
        return f"pid {pid} cannot be inspected ({type(exc).__name__})"
    env = rank_env(environ)
    if env is None or env.key != key or launcher:
        return f"pid {pid} is not rank {key[1]} of job {key[0]}"
    if not under_launcher:
        return f"pid {pid} is not under a rank launcher (torchrun, slurmstepd)"
    return environ, cmdline, cwd


__all__ = [
    "ProcEntry",
    "ProcStat",
    "exit_status",
    "is_rank_launcher",
    "is_torchrun_agent",
    "metrics_dir_argument",
    "nested_pids",
    "pid_dead",
    "proc_stat",
    "process_cwd",
    "rank_metrics_dir",
    "read_rank_process",
    "same_time",
    "train_option",
]
