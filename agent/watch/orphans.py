"""Ranks whose launcher is gone (issue 21): who they are, since when, and one event each.

When torchrun (or a Slurm step daemon, or a pod's main process) dies hard, its workers
keep running, re-parented to init or a subreaper: they hold their GPUs, ports and
checkpoint files, and block their peers' collectives until the job's collective timeout
(``torch.distributed`` default: 10 min for NCCL, 30 min for gloo). The rank watcher finds
them by what identifies them as a job's ranks (:meth:`~.discovery.RankFinder.discover_all`);
:class:`OrphanTracker` keeps when each was first seen without its launcher, for
``stormwatch_rank_orphaned_seconds`` (alert ``StormwatchRankOrphaned``) and the
``rank_orphaned`` event (:class:`~.events.RankOrphanedEvent`), and for the node-wide stops
that must reach them (``kill_node_processes``, the ``kill_torchrun`` revert).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from stormwatch.agent.watch.discovery import Orphan


@dataclasses.dataclass(frozen=True)
class OrphanInfo:
    """One rank process without its launcher.

    Attributes:
        job, rank: from its environment.
        pid, create_time: the process (its start time, Unix s: a reused pid is not it).
        ppid: who adopted it (1: init; else a subreaper).
        orphaned_at: Unix time the watcher first saw it without a launcher (within one
            scan interval of the launcher's death while the agent runs; the agent's start
            for an orphan it found at start-up).
    """

    job: str
    rank: int
    pid: int
    create_time: float
    ppid: int
    orphaned_at: float


class OrphanTracker:
    """The orphans of the last scan, each with when it was first seen.

    Args:
        on_orphan: called (on the scan thread) once per newly seen orphan; must not raise.
    """

    def __init__(self, on_orphan: Callable[[OrphanInfo], None] | None = None) -> None:
        self._on_orphan = on_orphan
        self._known: dict[tuple[int, float], OrphanInfo] = {}

    def update(self, orphans: Iterable[Orphan], now: float) -> list[OrphanInfo]:
        """Take the orphans a scan found (those not found any more are gone); returns the
        new ones (after calling ``on_orphan`` for each)."""
        current: dict[tuple[int, float], OrphanInfo] = {}
        new: list[OrphanInfo] = []
        for proc, env in orphans:
            key = (proc.pid, proc.create_time)
            known = self._known.get(key)
            if known is None:
                known = OrphanInfo(env.job, env.rank, proc.pid, proc.create_time, proc.ppid, now)
                new.append(known)
            current[key] = known
        self._known = current
        for info in new:
            if self._on_orphan is not None:
                self._on_orphan(info)
        return new

    def orphans(self) -> tuple[OrphanInfo, ...]:
        """The orphans of the last scan, by job, rank and pid."""
        return tuple(sorted(self._known.values(), key=lambda o: (o.job, o.rank, o.pid)))


__all__ = ["OrphanInfo", "OrphanTracker"]
