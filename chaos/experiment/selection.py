"""Targets and blast radius: which ranks an action's fault hits, and how many an experiment touches.

The job's shape is ``nodes`` nodes of ``nproc`` ranks each, ranks placed in order
(node ``i`` holds ranks ``i*nproc .. (i+1)*nproc-1``, as torchrun does with
``--node-rank``). Node names are the lab's (``node<i>``); a name that is not one of
them is matched by its trailing index (``gpu-node1`` is node 1) when placing targets
and counting the blast radius; faults that name nodes are sent with the name as given.

:func:`expand` turns one action into the concrete faults to inject (one per
selected rank for rank faults, one per node for node faults).
:func:`touched_ranks` is what the blast-radius guard counts: a rank fault touches
its rank; a node fault every rank of its node; a partition every rank of the
nodes cut off; ``kill_rdzv_host`` every rank of the first node; ``kill_agent`` none
(the training processes are not touched).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from stormwatch.chaos.errors import SelectionError
from stormwatch.chaos.experiment.model import ActionActivity, Experiment, TargetSelector
from stormwatch.faults import Blast, ExperimentFault, Target
from stormwatch.words import plural

_NODE_INDEX = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class Shape:
    """The job's layout: ``nodes`` node names in order, ``nproc`` ranks per node."""

    nodes: tuple[str, ...]
    nproc: int

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.nproc

    @classmethod
    def generic(cls, nodes: int, nproc: int) -> Shape:
        """A shape with the lab's node names (``node0``, ``node1``, ...)."""
        return cls(tuple(f"node{i}" for i in range(nodes)), nproc)

    def node_of(self, rank: int) -> str:
        return self.nodes[rank // self.nproc]

    def ranks_of(self, node: str) -> list[int]:
        index = self.node_index(node)
        return list(range(index * self.nproc, (index + 1) * self.nproc))

    def node_index(self, node: str) -> int:
        """The index of ``node`` (exact name, else its trailing number).

        Raises:
            SelectionError: no such node.
        """
        if node in self.nodes:
            return self.nodes.index(node)
        match = _NODE_INDEX.search(node)
        if match is not None and int(match.group(1)) < len(self.nodes):
            return int(match.group(1))
        raise SelectionError(f"no node {node!r} (the job runs on {', '.join(self.nodes)})")

    def check_rank(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise SelectionError(
                f"rank {rank} is out of range: the job has {plural(self.world_size, 'rank')} "
                f"({rank_range(self.world_size)})"
            )
        return rank


def select_ranks(selector: TargetSelector, shape: Shape) -> list[int]:
    """The ranks ``selector`` picks, sorted.

    Raises:
        SelectionError: a node or rank the job does not have, an empty pool, or
            ``random.k`` larger than the pool.
    """
    if selector.node is not None:
        pool = shape.ranks_of(selector.node)
    elif selector.ranks is not None:
        pool = sorted({shape.check_rank(r) for r in selector.ranks})
    elif selector.role == "leader":
        pool = [0]
    elif selector.role == "rdzv_host":
        pool = shape.ranks_of(shape.nodes[0])
    elif selector.role == "worker":
        pool = list(range(1, shape.world_size))
    else:
        pool = list(range(shape.world_size))
    if not pool:
        raise SelectionError("the selection is empty (a one-rank job has no 'worker')")
    pick = selector.random
    if pick is None:
        return pool
    if pick.k is not None and pick.k > len(pool):
        raise SelectionError(
            f"random.k {pick.k} is more than the {len(pool)} rank(s) to pick from; "
            f"lower it to at most {len(pool)}, or use random.percent"
        )
    count = pick.k if pick.k is not None else math.ceil(len(pool) * (pick.percent or 0) / 100)
    count = max(1, min(count, len(pool)))
    return sorted(random.Random(pick.seed).sample(pool, count))


def expand(action: ActionActivity, shape: Shape) -> list[ExperimentFault]:
    """The concrete faults of ``action``: its fault, or one per selected rank/node.

    Raises:
        SelectionError: see :func:`select_ranks`; or ``target`` on a fault kind that
            cannot take one (``partition``, ``kill_rdzv_host``, ``freeze_rank`` is fine).
    """
    fault = action.fault
    if action.target is None:
        return [fault]
    if fault.traits.fixed_place is not None:
        raise SelectionError(f"fault kind {fault.kind!r} takes no 'target' (it names its nodes)")
    ranks = select_ranks(action.target, shape)
    if fault.traits.target is Target.NODE_OR_RANK:
        nodes = sorted({shape.node_of(r) for r in ranks}, key=shape.node_index)
        return [fault.model_copy(update={"rank": None, "node": n}) for n in nodes]
    return [fault.model_copy(update={"rank": r}) for r in ranks]


def fault_ranks(fault: ExperimentFault, shape: Shape) -> set[int]:
    """The ranks one concrete fault touches (module docstring; the kind's
    :attr:`~stormwatch.faults.Traits.blast`)."""
    blast = fault.traits.blast
    if blast is Blast.NOTHING:
        return set()
    if blast is Blast.FIRST_NODE:
        return set(shape.ranks_of(shape.nodes[0]))
    nodes = fault.target_nodes()
    if nodes:
        return {r for n in nodes for r in shape.ranks_of(n)}
    rank = fault.target_rank()
    if rank is None:
        return set()
    shape.check_rank(rank)
    if fault.traits.target is Target.NODE_OR_RANK:
        return set(shape.ranks_of(shape.node_of(rank)))
    return {rank}


def touched_ranks(experiment: Experiment, shape: Shape) -> set[int]:
    """Every rank the experiment's faults touch (raises :class:`SelectionError` like :func:`expand`)."""
    touched: set[int] = set()
    for activity in experiment.method:
        if isinstance(activity, ActionActivity):
            for fault in expand(activity, shape):
                touched |= fault_ranks(fault, shape)
    return touched


def blast_radius_problem(experiment: Experiment, shape: Shape) -> str | None:
    """Why the experiment exceeds its blast radius, or None when it does not."""
    touched = touched_ranks(experiment, shape)
    limit = experiment.blast_radius.max_fraction_of_ranks
    allowed = allowed_ranks(limit, shape.world_size)
    if len(touched) <= allowed:
        return None
    return (
        f"the faults touch {len(touched)} of {shape.world_size} ranks "
        f"({sorted(touched)}), more than blast_radius.max_fraction_of_ranks = {limit:g} "
        f"allows ({allowed}); raise it or touch fewer ranks"
    )


def allowed_ranks(fraction: float, world_size: int) -> int:
    """How many ranks a blast radius of ``fraction`` allows: ``floor(fraction * world)``,
    but at least one (a single-rank fault is the smallest experiment there is)."""
    return max(1, math.floor(fraction * world_size + 1e-9))


def rank_range(world_size: int) -> str:
    """The ranks of a job of ``world_size``: ``'0'`` for one rank, else ``'0-3'``."""
    return "0" if world_size == 1 else f"0-{world_size - 1}"


def static_shape(experiment: Experiment) -> Shape | None:
    """The job's shape when the file fixes it (``nodes`` and ``nproc_per_node``), else None."""
    job = experiment.job
    if job.nodes is not None and job.nproc_per_node is not None:
        return Shape.generic(job.nodes, job.nproc_per_node)
    return None


__all__ = [
    "Shape",
    "allowed_ranks",
    "blast_radius_problem",
    "expand",
    "fault_ranks",
    "rank_range",
    "select_ranks",
    "static_shape",
    "touched_ranks",
]
