"""What a launcher kill leaves behind, and how it is removed (issue 21).

``kill_torchrun`` kills the launcher and nothing else: its ranks keep running, orphaned,
until the job's own collective timeout ends them, something stops them (the responder's
restart, ``kill_node_processes``, ``lab down``), or the fault's revert does. The fault
records the ranks it orphaned (:func:`orphan_entries`, in the injection's ``details``:
``orphans`` for the journal, ``orphaned_processes`` with their descendants for the revert)
and its revert stops what is left of them (:func:`reap`), so that no rank of that job
outlives the experiment; the revert's outcome (``details["revert"]``) says what removed
each: ``exited before the revert`` or ``the revert: ...`` (:func:`describe_orphans`, the
line the chaos journal and the post-mortem show).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psutil

from stormwatch.faults.errors import FaultError
from stormwatch.faults.node import FaultContext, RankSeen
from stormwatch.faults.system import job_orphans, process_ref, same_process

#: Seconds from SIGTERM to SIGKILL when a revert stops what a kill orphaned: the lab's
#: grace period (``LabConfig.grace_period_s``). A rank blocked in a collective ignores
#: SIGTERM until the collective returns, so a longer grace only delays the SIGKILL.
REAP_GRACE_S = 5.0
#: ``removed_by`` of an orphan gone before the revert looked: the job's collective
#: timeout, or a node-wide stop (the responder's restart, ``kill_node_processes``).
EXITED_BEFORE = "exited before the revert (its collective timeout, or a node-wide stop)"


def descendants(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """``procs`` and every live descendant of each (a rank's data-loader workers), by pid;
    collected before any is signalled (a killed rank leaves its workers to init)."""
    found: dict[int, psutil.Process] = {}
    for proc in procs:
        found.setdefault(proc.pid, proc)
        try:
            found.update((c.pid, c) for c in proc.children(recursive=True))
        except psutil.Error:  # gone meanwhile: no children to collect
            continue
    return [found[pid] for pid in sorted(found)]


def orphan_entries(ranks: Sequence[RankSeen]) -> list[dict[str, Any]]:
    """``[{job, rank, pid, create_time}]`` of the rank processes a kill orphans."""
    return [
        {"job": r.job, "rank": r.rank, "pid": r.pid, "create_time": r.started_at} for r in ranks
    ]


def process_refs(ranks: Sequence[RankSeen]) -> list[list[float]]:
    """``[pid, create_time]`` of the rank processes and their descendants, still running."""
    procs = [p for r in ranks if (p := same_process([r.pid, r.started_at])) is not None]
    refs = []
    for proc in descendants(procs):
        try:
            refs.append(process_ref(proc))
        except psutil.Error:  # gone since the walk: nothing to stop later
            continue
    return refs


def reap(ctx: FaultContext, details: Mapping[str, Any]) -> dict[str, Any]:
    """Stop what is left of the orphans an injection recorded (``details``), and of any
    other orphan of its job on this node; the outcome for ``details["revert"]``.

    Raises:
        FaultError: something must be stopped and the node has no way to stop processes,
            or a process is still running after SIGKILL.
    """
    recorded = [p for ref in details.get("orphaned_processes", []) if (p := same_process(ref))]
    ctx.ranks.scan()
    left = descendants([*recorded, *job_orphans(ctx, details.get("job"))])
    how = "nothing was left to stop"
    killed: set[int] = set()
    if left:
        if ctx.stop_processes is None:
            raise FaultError(f"cannot stop the orphaned processes {[p.pid for p in left]}")
        stopped = ctx.stop_processes(left, grace_s=REAP_GRACE_S)
        if stopped.left:
            raise FaultError(f"orphaned processes still running after SIGKILL: {stopped.left}")
        how, killed = stopped.describe(), set(stopped.killed)
    running = {p.pid for p in left}
    orphans = []
    for entry in details.get("orphans", []):
        pid = int(entry["pid"])
        if pid not in running:
            removed_by = EXITED_BEFORE
        else:
            removed_by = (
                f"the revert: SIGKILL after {REAP_GRACE_S:g} s"
                if pid in killed
                else ("the revert: SIGTERM")
            )
        orphans.append({**entry, "removed_by": removed_by})
    return {"orphans": orphans, "stopped": [p.pid for p in left], "how": how}


def describe_orphans(details: Mapping[str, Any]) -> str:
    """One line of what a kill orphaned and, after its revert, what removed each:
    ``orphaned rank 1 of job j (pid 42): the revert: SIGTERM`` ('' when none)."""
    revert = details.get("revert") or {}
    entries = revert.get("orphans") if isinstance(revert, Mapping) else None
    if entries is None:
        entries = details.get("orphans") or []
    parts = []
    for e in entries:
        part = f"rank {e.get('rank')} of job {e.get('job')} (pid {e.get('pid')})"
        parts.append(part + (f": {e['removed_by']}" if e.get("removed_by") else ""))
    return ("orphaned " + "; ".join(parts)) if parts else ""


__all__ = [
    "EXITED_BEFORE",
    "REAP_GRACE_S",
    "descendants",
    "describe_orphans",
    "orphan_entries",
    "process_refs",
    "reap",
]
