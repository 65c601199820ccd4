"""Elastic lab jobs: rendezvous settings, the constant global batch, FC-09's terminal state.

What torch 2.13 does when a node of an elastic job is lost and comes back is
described in :mod:`stormwatch.lab.jobs.torchrun` and docs/ARCHITECTURE.md
"Elastic resize"; the launching, rejoining and relaunching live in
:mod:`~stormwatch.lab.jobs.launch` (they start processes), the pure parts here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from stormwatch.lab.config import JobSpec
from stormwatch.lab.errors import JobError
from stormwatch.lab.services import procs
from stormwatch.lab.state import JobRecord, LabState
from stormwatch.trainer.config import DataConfig

#: ``--rdzv-conf`` of an elastic job (seconds). ``keep_alive_*``: a dead node leaves the
#: rendezvous after 1 s x 3 missed heartbeats instead of torch's default 5 s x 3;
#: ``last_call_timeout``: how long a round waits for more nodes once ``min_nodes`` are in
#: (torch's default 30 s); ``join_timeout``: how long a node waits for ``min_nodes``.
ELASTIC_RDZV_CONF: dict[str, int] = {
    "join_timeout": 120,
    "last_call_timeout": 2,
    "close_timeout": 10,
    "keep_alive_interval": 1,
    "keep_alive_max_attempt": 3,
}


def global_batch_of(state: LabState, spec: JobSpec) -> int | None:
    """The ``--global-batch`` of the job: ``spec.global_batch``; for an elastic job without
    one, ``micro_batch x lcm(min_nodes..nodes)`` (every dp it may run at divides it);
    ``None`` (the trainer's default) otherwise."""
    if spec.global_batch is not None or spec.min_nodes is None:
        return spec.global_batch
    nodes = spec.node_count(state.config)
    return DataConfig().micro_batch * math.lcm(*range(spec.min_nodes, nodes + 1))


def check_elastic(state: LabState, spec: JobSpec) -> None:
    """Raise :class:`JobError` when ``spec.nodes`` or ``spec.min_nodes`` does not fit the lab."""
    nodes = spec.node_count(state.config)
    if nodes > state.config.nodes:
        raise JobError(
            f"nodes: job {spec.name!r} wants {nodes} nodes but the lab has "
            f"{state.config.nodes}; pass --job-nodes between 1 and {state.config.nodes}"
        )
    if spec.min_nodes is not None and spec.min_nodes > nodes:
        raise JobError(
            f"min_nodes: {spec.min_nodes} is more than {_whose(state, spec)} {nodes} nodes; "
            f"pass --min-nodes between 1 and {nodes}"
        )


def min_nodes_problem(state: LabState, spec: JobSpec) -> str | None:
    """``lab train``'s wording of a ``--min-nodes`` above the job's nodes, or ``None``."""
    nodes = spec.node_count(state.config)
    if spec.min_nodes is None or spec.min_nodes <= nodes:
        return None
    return (
        f"--min-nodes: {spec.min_nodes} is more than {_whose(state, spec)} {nodes} nodes; pass "
        f"--min-nodes 1..{nodes} (or --job-nodes, or start a larger lab: "
        f"`stormwatch lab up --nodes {spec.min_nodes}`)"
    )


def _whose(state: LabState, spec: JobSpec) -> str:
    """``the lab's`` when the job spans every node, else ``job NAME's``."""
    return (
        "the lab's"
        if spec.node_count(state.config) == state.config.nodes
        else f"job {spec.name!r}'s"
    )


#: Relaunches of one job after a closed rendezvous before the lab lets it fail (FC-09).
MAX_RELAUNCHES = 3

#: What a torchrun log says when its rendezvous was closed under it (FC-09).
CLOSED_MARKER = "RendezvousClosedError"


def rendezvous_closed(record: JobRecord) -> list[str]:
    """Nodes whose torchrun has ended with ``RendezvousClosedError`` (FC-09's terminal
    state: no agent of this rendezvous id can ever join again)."""
    closed = []
    for node, process in record.processes.items():
        code = procs.exit_status(process).returncode
        if code not in (None, 0) and CLOSED_MARKER in log_tail(process.log_file, 16384):
            closed.append(node)
    return sorted(closed)


def port_conflicted(record: JobRecord) -> list[str]:
    """Nodes whose torchrun has ended because a port was in use (its rendezvous store could
    not listen: ``DistNetworkError ... EADDRINUSE``), matched by
    :func:`stormwatch.ports.says_port_conflict` (case-insensitive)."""
    from stormwatch.ports import says_port_conflict

    found = []
    for node, process in record.processes.items():
        code = procs.exit_status(process).returncode
        if code not in (None, 0) and says_port_conflict(log_tail(process.log_file, 16384)):
            found.append(node)
    return sorted(found)


def log_tail(log_file: Path, tail_bytes: int) -> str:
    """The last ``tail_bytes`` of a log ("" when it cannot be read)."""
    try:
        with log_file.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - tail_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


__all__ = [
    "CLOSED_MARKER",
    "ELASTIC_RDZV_CONF",
    "MAX_RELAUNCHES",
    "check_elastic",
    "global_batch_of",
    "log_tail",
    "min_nodes_problem",
    "rendezvous_closed",
]
