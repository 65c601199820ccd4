"""The job's attempt: restarts counted per job, agreed by every rank at start-up.

torchrun's ``TORCHELASTIC_RESTART_COUNT`` is per node agent. A node whose own workers
failed counts a restart; a node whose workers torchrun stopped only because a *peer*
node failed (it saw the peer waiting in the next rendezvous round) does not. Over a job
the node counts drift apart, and ``max()`` of them is not the job's attempt: a failure on
node A then one on node B leave both at 1 after two restarts.

:func:`agree_job_attempt` gives every rank of a rendezvous round the same job attempt:

1. each rank reads what its node remembers (``<folder>/attempts/<node key>.json``: the
   job attempt and the node's restart count when it last agreed one);
2. the ranks exchange (node, node restarts, remembered) with one all-gather over the
   default process group (the group *is* the round: its members are exactly the
   ranks of this attempt, whatever store torchrun gave them; a ``TCPStore`` of torchrun's
   is fresh per round with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, so it cannot carry
   a count across rounds);
3. every rank computes the same :func:`decide` of the same list, and writes the result
   into its node's memory (after the all-gather, so no rank of this round read it).

:func:`decide`: every node restart count 0 is a fresh job (attempt 0; memories of an
earlier job of the same name are overwritten); else the attempt is one more than the
highest remembered, and never below the highest node count (each of a node's restarts
is a restart of the job). The *cause*: the nodes whose count went up since they last
agreed (their own workers failed); the others restarted because a peer failed. The
rank within the failed node is what the node agent saw exit or hang (its ``rank_exit``
/ ``rank_hang`` events), joined by the post-mortems.

Known limits: a round that fails between ``init_process_group`` and this agreement is
not remembered (its restart is still counted by the failed node's count); a job whose
nodes all lost their memory (a folder per node that was wiped) starts counting again
from the node counts. Without a folder there is no memory and the attempt is the highest
node count (``agreed`` is False then). No torch import at module level.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

#: The node's name in the job's records: ``STORMWATCH_NODE``, else the host name.
NODE_ENV = "STORMWATCH_NODE"
#: Subfolder of the memory folder holding one file per node.
MEMORY_FOLDER = "attempts"


@dataclass(frozen=True, kw_only=True)
class NodeReport:
    """What one rank brings to the agreement.

    Attributes:
        node: the node's name (for people: ``node1``, a host name).
        key: the node's torchrun agent (name and agent pid), stable across its rounds.
        node_restarts: the node-local restart count (``TORCHELASTIC_RESTART_COUNT``).
        remembered_attempt: the job attempt this node last agreed, ``None``: none.
        remembered_restarts: the node's restart count then.
    """

    node: str
    key: str
    node_restarts: int
    remembered_attempt: int | None = None
    remembered_restarts: int | None = None


@dataclass(frozen=True, kw_only=True)
class JobAttempt:
    """The job attempt every rank of this round agreed (see the module docstring).

    Attributes:
        attempt: restarts of the whole job so far (0: the first start).
        node_restarts: this node's own count (``TORCHELASTIC_RESTART_COUNT``).
        node: this node's name.
        failed_nodes: the nodes whose own workers failed before this attempt (their
            count went up): the restart's cause; empty on a fresh start.
        node_counts: node name -> its restart count, for every node of the round.
        agreed: the ranks agreed it with a memory; False: the highest node count.
    """

    attempt: int
    node_restarts: int
    node: str
    failed_nodes: tuple[str, ...] = ()
    node_counts: Mapping[str, int] | None = None
    agreed: bool = True


def node_name(environ: Mapping[str, str]) -> str:
    """This node's name: ``STORMWATCH_NODE``, else the host name."""
    return environ.get(NODE_ENV) or socket.gethostname()


def node_key(environ: Mapping[str, str]) -> str:
    """The node's agent, stable across its rounds: the node's name and, under torchrun,
    the workers' parent (the agent; two agents on one host are two nodes)."""
    name = node_name(environ)
    if "TORCHELASTIC_RUN_ID" in environ:
        name = f"{name}-{os.getppid()}"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _memory_path(folder: Path, key: str) -> Path:
    return folder / MEMORY_FOLDER / f"{key}.json"


def remember(folder: Path | None, key: str, job: str) -> tuple[int | None, int | None]:
    """The (job attempt, node restarts) the node last agreed for ``job``; ``None`` each
    when nothing (or something unreadable, or another job's) is remembered."""
    if folder is None:
        return None, None
    try:
        record = json.loads(_memory_path(folder, key).read_text(encoding="utf-8"))
        if record.get("job") != job:
            return None, None
        return int(record["attempt"]), int(record["node_restarts"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, None


def memorise(folder: Path, key: str, job: str, agreed: JobAttempt) -> None:
    """Write the agreed attempt into the node's memory (atomic: a rename)."""
    path = _memory_path(folder, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**asdict(agreed), "job": job, "node_counts": dict(agreed.node_counts or {})}
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, path)


def decide(reports: Sequence[NodeReport], mine: NodeReport, *, agreed: bool = True) -> JobAttempt:
    """The job attempt of a round from every rank's report (the same on every rank)."""
    counts: dict[str, int] = {}
    for report in reports:
        counts[report.node] = max(counts.get(report.node, 0), report.node_restarts)
    highest = max(counts.values(), default=0)
    if highest == 0:
        return JobAttempt(
            attempt=0, node_restarts=mine.node_restarts, node=mine.node, node_counts=counts
        )
    remembered = [r.remembered_attempt for r in reports if r.remembered_attempt is not None]
    attempt = max(max(remembered, default=-1) + 1, highest)
    failed = sorted(
        {
            r.node
            for r in reports
            if r.node_restarts > (r.remembered_restarts if r.remembered_restarts is not None else 0)
        }
    )
    return JobAttempt(
        attempt=attempt,
        node_restarts=mine.node_restarts,
        node=mine.node,
        failed_nodes=tuple(failed),
        node_counts=counts,
        agreed=agreed and bool(remembered),
    )


Gather = Callable[[NodeReport], list[NodeReport]]


def gather_over_default_group(mine: NodeReport) -> list[NodeReport]:
    """Every rank's report, by one ``all_gather_object`` over the default process group
    (its CPU backend when it has one). Collective: every rank must call it."""
    import torch.distributed as dist

    found: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(found, asdict(mine))
    return [NodeReport(**item) for item in found if isinstance(item, dict)]


def agree_job_attempt(
    *,
    job: str,
    node_restarts: int,
    folder: Path | None,
    environ: Mapping[str, str] | None = None,
    gather: Gather = gather_over_default_group,
) -> JobAttempt:
    """Agree the job attempt with every rank of this round (module docstring);
    collective once the process group exists.

    Args:
        job: the job's name (memories of another job are ignored).
        node_restarts: this node's ``TORCHELASTIC_RESTART_COUNT``.
        folder: where the node remembers (``<folder>/attempts/``): the rank log folder
            (kept for the job's whole life); ``None``: no memory.
        environ: where the node's name comes from (default ``os.environ``).
        gather: every rank's report from this rank's (default: the process group).

    Raises:
        RuntimeError: the all-gather failed (a peer is gone: the round is over anyway).
    """
    env = os.environ if environ is None else environ
    key = node_key(env)
    attempt, restarts = remember(folder, key, job)
    mine = NodeReport(
        node=node_name(env),
        key=key,
        node_restarts=node_restarts,
        remembered_attempt=attempt,
        remembered_restarts=restarts,
    )
    agreed = decide(gather(mine), mine, agreed=folder is not None)
    if folder is not None:
        with contextlib.suppress(OSError):  # no memory next time: the node counts then
            memorise(folder, key, job, agreed)
    return agreed


__all__ = [
    "MEMORY_FOLDER",
    "NODE_ENV",
    "JobAttempt",
    "NodeReport",
    "agree_job_attempt",
    "decide",
    "gather_over_default_group",
    "memorise",
    "node_key",
    "node_name",
    "remember",
]
