"""Finding this node's rank processes (steps 2 and 3 of a rank-watcher scan).

One scan lists every process (:meth:`RankFinder.process_table`, one ``/proc/<pid>/stat``
read each; or, while the proc connector has counted no process created, exec'd or ended
since, reuses the last listing and what was found in it), finds rank launchers
(``is_agent``: torchrun agents, Slurm step daemons) and, among their descendants that
are not launchers themselves, takes the topmost process per rank whose environment says it is one (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and
``TORCHELASTIC_RUN_ID``, or srun's with ``STORMWATCH_RUN_ID``:
:func:`stormwatch.contracts.rank_env.rank_env`) and that this node *claims*
(:meth:`RankFinder.claims`). A process's name, command line, environment and claim are
read once and kept while it runs the same program: they change only on ``exec``, which
places the new environment afresh in memory (and usually changes the command name;
``stormwatch run`` execs the job's command in place), so they are keyed by pid, start
time, command name and that place (:attr:`~.procs.ProcEntry.key`). What
may be caught in between is read afresh at every scan instead: a process younger than
:data:`SETTLE_SECONDS` (it may still be a fork of its parent that has not yet exec'd its
own program: same command name, the parent's command line and environment), and one
whose command line reads empty (inside ``exec``: the new command name, no command line
or environment yet; kernel threads, which have none, excepted).
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import psutil

from stormwatch.agent.watch.procs import (
    ProcEntry,
    proc_stat,
    process_cwd,
    rank_metrics_dir,
    read_rank_process,
)
from stormwatch.contracts.rank_env import RankEnv, RankKey, rank_env

#: ``(pid, create time, command name, image)``: one program run by one process, even after
#: its pid is reused (:attr:`~.procs.ProcEntry.key`).
_ProcKey = tuple[int, float, str, int]

#: Seconds after its start before what a process's reads say is kept (fork, then exec).
SETTLE_SECONDS = 1.0
#: Longest reuse of one listing of the process table (s): a safety net under the proc
#: connector's count of process events, which reuse relies on.
RELIST_SECONDS = 10.0

#: The rank processes one scan found: per ``(job, rank)``, its process and environment.
Found = dict[RankKey, tuple[ProcEntry, RankEnv]]


class Orphan(NamedTuple):
    """A rank process that outlived its launcher (:meth:`RankFinder.discover_all`)."""

    proc: ProcEntry
    env: RankEnv


class RankFinder:
    """Finds the rank processes this node owns.

    Args:
        metrics_dir: this node's metrics folder (what a rank must name to be claimed).
        is_agent: ``(name, cmdline) -> bool`` recognising rank launchers.
        claim_unlabelled: claim ranks that name no metrics folder at all (right for one
            agent per host; the lab, several agents in one PID namespace, sets it False).
        changes: the count of process events (forks, execs, exits;
            :meth:`~.proc_exits.ExitSource.changes`), or None when unknown: while it stands
            still, :meth:`process_table` returns its last listing (every process in it
            settled, and listed less than :data:`RELIST_SECONDS` ago) instead of reading
            every process again, and :meth:`discover_all` its last answer for it.
    """

    def __init__(
        self,
        metrics_dir: Path,
        *,
        is_agent: Callable[[str, Sequence[str]], bool],
        claim_unlabelled: bool,
        changes: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._dir = Path(metrics_dir)
        self._changes = changes
        # The last listing, the event count read before it, when it was made (monotonic s)
        # and whether it may be reused (every process in it settled).
        self._listing: dict[int, ProcEntry] = {}
        self._listed_at_count: int | None = None
        self._listed_at = -RELIST_SECONDS
        self._reusable = False
        self._discovered: tuple[object, Found, list[Orphan]] | None = None
        self._forgotten_for: object = None
        #: Scans that listed every process, and scans that reused the last listing.
        self.listings = 0
        self.reuses = 0
        self._is_agent = is_agent
        self._claim_unlabelled = claim_unlabelled
        self._environ: dict[_ProcKey, Mapping[str, str] | None] = {}
        self._rank_envs: dict[_ProcKey, RankEnv | None] = {}
        self._launchers: dict[_ProcKey, bool] = {}
        self._claims: dict[_ProcKey, bool] = {}
        self._names: dict[_ProcKey, tuple[str, tuple[str, ...]]] = {}
        self._entries: dict[int, ProcEntry] = {}  # the last table's settled entries
        self._settled_before = 0.0  # processes started before this Unix time are settled

    def process_table(self) -> dict[int, ProcEntry]:
        """Every process, from one ``/proc/<pid>/stat`` read each (:func:`~.procs.proc_stat`),
        or the last listing while no process event came since (class docstring; the
        returned mapping is shared: read it, do not change it).

        Name and command line (psutil) are read once per program a process runs.
        """
        count = self._changes()  # read before listing: an event during it lists again
        if (
            count is not None
            and count == self._listed_at_count
            and self._reusable
            and time.monotonic() - self._listed_at < RELIST_SECONDS
        ):
            self.reuses += 1
            return self._listing
        table = self._list()
        self.listings += 1
        self._listing, self._listed_at_count = table, count
        self._listed_at = time.monotonic()
        self._reusable = len(self._entries) == len(table)  # every process settled
        return table

    def _list(self) -> dict[int, ProcEntry]:
        table: dict[int, ProcEntry] = {}
        names: dict[_ProcKey, tuple[str, tuple[str, ...]]] = {}
        entries: dict[int, ProcEntry] = {}
        boot = psutil.boot_time()
        self._settled_before = time.time() - SETTLE_SECONDS
        for pid in psutil.pids():
            stat = proc_stat(pid, boot)
            if stat is None:
                continue  # gone since psutil.pids()
            ppid, zombie, create_time, comm, image = stat
            key = (pid, create_time, comm, image)
            known = self._names.get(key)
            last = self._entries.get(pid)
            if (
                known is not None
                and last is not None
                and last.ppid == ppid
                and last.zombie == zombie
                and last.key == key
            ):  # a settled process as the last scan saw it: that entry, not a new one
                names[key] = known
                table[pid] = entries[pid] = last
                continue
            if known is None:
                try:
                    proc = psutil.Process(pid)
                    known = (proc.name(), tuple(proc.cmdline()))
                except psutil.ZombieProcess:
                    known = ("", ())
                except psutil.Error:
                    continue  # gone, or not ours to read: not a rank this node can watch
            entry = ProcEntry(
                pid=pid,
                ppid=ppid,
                name=known[0],
                cmdline=known[1],
                create_time=create_time,
                zombie=zombie,
                comm=comm,
                image=image,
            )
            if self._settled(entry):
                names[key] = known
                entries[pid] = entry
            table[pid] = entry
        self._names = names  # only live processes stay cached
        self._entries = entries
        return table

    def discover(self, table: Mapping[int, ProcEntry]) -> Found:
        """The topmost claimed rank process per ``(job, rank)`` under a rank launcher
        (the earliest started one when a rank appears twice)."""
        return self.discover_all(table)[0]

    def discover_all(self, table: Mapping[int, ProcEntry]) -> tuple[Found, list[Orphan]]:
        """:meth:`discover`'s ranks, and the claimed rank processes no launcher is above.

        An *orphan* is recognised by what identifies it as a job's rank (its environment,
        and its metrics folder for the claim), not by its parent: a process with a rank
        environment that descends from no live launcher (torchrun or the step daemon died
        hard and it was re-parented to init or a subreaper) and whose parent is not a rank
        of the same ``(job, rank)`` (a rank's data-loader workers are part of the rank;
        once the rank is gone, they are orphans of their own).
        """
        if self._discovered is not None and self._discovered[0] is table:  # a reused listing
            _, found, orphans = self._discovered
            return dict(found), list(orphans)
        found, orphans = self._discover_all(table)
        self._discovered = (table, dict(found), list(orphans))
        return found, orphans

    def _discover_all(self, table: Mapping[int, ProcEntry]) -> tuple[Found, list[Orphan]]:
        children: dict[int, list[int]] = collections.defaultdict(list)
        for entry in table.values():
            children[entry.ppid].append(entry.pid)
        agents = [p.pid for p in table.values() if not p.zombie and self._launcher(p)]
        found: Found = {}
        stack: list[tuple[int, bool]] = [(c, False) for a in agents for c in children[a]]
        visited: set[int] = set()
        while stack:
            pid, inside_rank = stack.pop()
            proc = table.get(pid)
            if proc is None or pid in visited or proc.zombie:
                continue
            visited.add(pid)
            if not inside_rank and not self._launcher(proc):
                env = self._rank_env_of(proc)
                if env is not None:
                    inside_rank = True  # its own children (data loaders...) are not ranks
                    if self._claimed(proc) and (
                        env.key not in found or found[env.key][0].create_time > proc.create_time
                    ):
                        found[env.key] = (proc, env)
            stack.extend((child, inside_rank) for child in children[pid])
        return found, self._orphans(table, visited)

    def _orphans(self, table: Mapping[int, ProcEntry], under: set[int]) -> list[Orphan]:
        orphans: list[Orphan] = []
        own = os.getpid()
        for proc in table.values():
            if proc.pid in under or proc.zombie or proc.pid == own:
                continue
            env = self._rank_env_of(proc)
            if env is None or self._launcher(proc):
                continue
            parent = table.get(proc.ppid)
            parent_env = self._rank_env_of(parent) if parent is not None else None
            if parent_env is not None and parent_env.key == env.key:
                continue  # a child of the rank's own process: part of that rank
            if self._claimed(proc):
                orphans.append(Orphan(proc, env))
        return orphans

    def forget_gone(self, table: Mapping[int, ProcEntry]) -> None:
        """Drop what is cached about processes not in ``table`` (they are gone)."""
        if table is self._forgotten_for:  # a reused listing: nothing new is gone
            return
        self._forgotten_for = table
        live = {p.key for p in table.values()}
        self._environ = {k: v for k, v in self._environ.items() if k in live}
        self._rank_envs = {k: v for k, v in self._rank_envs.items() if k in live}
        self._launchers = {k: v for k, v in self._launchers.items() if k in live}
        self._claims = {k: v for k, v in self._claims.items() if k in live}

    def claims(
        self, environ: Mapping[str, str], cmdline: Sequence[str], cwd: str | None
    ) -> str | None:
        """Whether this node owns a rank with this environment, command line and
        working directory: None when it does, else why not (one sentence)."""
        owner = rank_metrics_dir(environ, cmdline, cwd)
        if owner is None:
            if self._claim_unlabelled:
                return None
            return "it names no metrics dir and this agent runs with --no-claim-unlabelled-ranks"
        mine = Path(os.path.realpath(self._dir))
        if owner == mine:
            return None
        return f"its metrics dir {owner} is not this node's {mine}"

    def check_owned(self, pid: int, create_time: float, key: RankKey) -> str | None:
        """Re-check, from fresh reads, that ``pid`` is still the claimed rank ``key``.

        Returns None when it is: the same process (start time ``create_time``),
        not a zombie, under a rank launcher, with ``key``'s rank environment,
        claimed by this node. Otherwise the reason it is not (for a 404).
        """
        fresh = read_rank_process(pid, create_time, key, self._is_agent)
        if isinstance(fresh, str):
            return fresh
        environ, cmdline, cwd = fresh
        why = self.claims(environ, cmdline, cwd)
        return None if why is None else f"pid {pid} is not this node's rank: {why}"

    def _environ_of(self, proc: ProcEntry) -> Mapping[str, str] | None:
        key = proc.key
        if key in self._environ:
            return self._environ[key]
        try:
            environ: Mapping[str, str] | None = psutil.Process(proc.pid).environ()
        except psutil.Error:
            environ = None  # gone or unreadable: not a rank this node can own
        if self._settled(proc):
            self._environ[key] = environ
        return environ

    def _rank_env_of(self, proc: ProcEntry) -> RankEnv | None:
        """``proc``'s rank identity (:func:`rank_env` of its environment), None when it is
        not a rank; kept, like the environment, while it runs the same program."""
        key = proc.key
        if key in self._rank_envs:
            return self._rank_envs[key]
        environ = self._environ_of(proc)
        env = rank_env(environ) if environ else None
        if self._settled(proc):
            self._rank_envs[key] = env
        return env

    def _launcher(self, proc: ProcEntry) -> bool:
        """Whether ``proc`` launches ranks (``is_agent``); kept while it runs the same program
        (every scan asks it of every process: recomputing it cost a fifth of a scan)."""
        key = proc.key
        if key in self._launchers:
            return self._launchers[key]
        launcher = self._is_agent(proc.name, proc.cmdline)
        if self._settled(proc):
            self._launchers[key] = launcher
        return launcher

    def _claimed(self, proc: ProcEntry) -> bool:
        key = proc.key
        if key in self._claims:
            return self._claims[key]
        environ = self._environ_of(proc) or {}
        claimed = self.claims(environ, proc.cmdline, process_cwd(proc.pid)) is None
        if self._settled(proc):
            self._claims[key] = claimed
        return claimed

    def _settled(self, proc: ProcEntry) -> bool:
        """Whether what was read about ``proc`` can be kept (see the module docstring)."""
        if proc.create_time >= self._settled_before:
            return False
        kernel_thread = proc.pid == 2 or proc.ppid == 2
        return bool(proc.cmdline) or proc.zombie or kernel_thread


__all__ = ["SETTLE_SECONDS", "Found", "Orphan", "RankFinder"]
