"""Process inspection for the rank watcher: who is a torchrun agent, who is a rank.

Split from :mod:`stormwatch.agent.ranks` (which tracks rank lives) to keep
each module to one job: here are the pure helpers that read ``/proc``, the
environment and command lines.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

RankKey = tuple[str, int]
"""(job, rank)."""

_RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")
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


@dataclasses.dataclass(frozen=True)
class RankEnv:
    """What a rank's environment says about it."""

    job: str
    rank: int
    local_rank: int
    world_size: int
    run_id: str
    restart_count: int | None
    metrics_dir: str | None = None

    @property
    def key(self) -> RankKey:
        return (self.job, self.rank)


def rank_env(environ: Mapping[str, str]) -> RankEnv | None:
    """Parse a rank's identity from its environment; None when it is not a rank."""
    if any(name not in environ for name in _RANK_ENV):
        return None
    try:
        restart = environ.get("TORCHELASTIC_RESTART_COUNT")
        return RankEnv(
            job=environ.get("STORMWATCH_JOB") or environ["TORCHELASTIC_RUN_ID"],
            rank=int(environ["RANK"]),
            local_rank=int(environ["LOCAL_RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            run_id=environ["TORCHELASTIC_RUN_ID"],
            restart_count=int(restart) if restart is not None else None,
            metrics_dir=environ.get("STORMWATCH_METRICS_DIR") or None,
        )
    except ValueError:
        return None


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
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
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


__all__ = [
    "ProcEntry",
    "RankEnv",
    "RankKey",
    "is_torchrun_agent",
    "pid_dead",
    "proc_stat",
    "rank_env",
    "same_time",
]
