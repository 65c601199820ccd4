"""Nodes back into service after a fault: what a platform does once the faults on its nodes
are reverted (:class:`NodeService`), and Slurm's (:class:`SlurmNodes`).

A scheduler takes a node it cannot reach out of service by itself: Slurm sets a node that
missed its pings for ``SlurmdTimeout`` DOWN with reason ``Not responding``. Once its link
heals it stays DOWN until ``scontrol update NodeName=N State=RESUME``, unless one of
slurmctld's later pings reaches it first (with ``ReturnToService`` 1 or 2 a node that answers
again is returned; in the lab that raced the rollback, a few seconds after the heal,
either way). The runner's rollbacks
(:class:`~stormwatch.chaos.execution.rollback.RollbackExecutor`) hand the nodes of the
faults they reverted to the target's :class:`NodeService`; a node an operator drained or
set down for any other reason is never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.slurm import SlurmBackend, SlurmNodeInfo
from stormwatch.platforms.slurm_readback import describe_node, drained, in_service

#: The reason slurmctld gives a node it sets DOWN for not answering its pings for
#: ``SlurmdTimeout`` (src/slurmctld/ping_nodes.c); an operator's reason is anything else.
NOT_RESPONDING_REASON = "Not responding"
#: Slurm stamps a reason to the second (``[slurm@2026-12-02T06:12:01]``).
_STAMP_RESOLUTION_S = 1.0


@dataclass(frozen=True, kw_only=True)
class NodeReturn:
    """What the platform did for one node once the faults on it were reverted.

    Attributes:
        node: the node's name.
        action: ``in service`` (nothing to do), ``resumed`` (the scheduler had taken it
            out of service during the fault; put back, read back), ``back`` (it was not
            answering and came back by itself, read back), ``left`` (out of service for
            another reason: not touched) or ``failed``.
        before: its state as first read (the scheduler's words), None when unreadable.
        detail: what was done or seen.
    """

    node: str
    action: str
    before: str | None
    detail: str


class NodeService(Protocol):
    """Puts nodes back into service after a fault cut them off (a Slurm node set DOWN as
    not responding); every platform whose scheduler takes unreachable nodes out of
    service has one."""

    def return_to_service(self, nodes: Sequence[str], *, since: float) -> list[NodeReturn]:
        """Return each of ``nodes`` to service if the scheduler took it out on its own
        since ``since`` (Unix s, the first fault's injection); never a node taken out
        for another reason (an operator's drain). Never raises: a node that could not be
        returned says so in its :class:`NodeReturn` (``failed``)."""
        ...


class SlurmNodes:
    """The :class:`NodeService` of a Slurm target.

    A node cut off from slurmctld (a partition, a link down) is set DOWN with reason
    ``Not responding`` after ``SlurmdTimeout``; once it answers again it needs
    ``scontrol update NodeName=N State=RESUME``, unless a later ping of slurmctld's
    returned it first (``ReturnToService`` 1 or 2). Per node, as first read:

    * in service (IDLE/MIXED/ALLOCATED, no flag): nothing to do;
    * DOWN, not drained, reason ``Not responding`` stamped at or after ``since``:
      :meth:`SlurmBackend.resume_node` (read back in service) -> ``resumed``;
    * not responding but not DOWN yet: slurmctld clears it at its next ping; read back
      in service -> ``back``;
    * anything else (drained, DOWN for an operator's reason or since before the fault):
      left alone.
    """

    def __init__(self, backend: SlurmBackend) -> None:
        self._backend = backend

    def return_to_service(self, nodes: Sequence[str], *, since: float) -> list[NodeReturn]:
        try:
            found = self._backend.commands.nodes(*nodes)
        except BackendError as exc:
            return [
                NodeReturn(node=n, action="failed", before=None, detail=str(exc)) for n in nodes
            ]
        return [self._one(name, found.get(name), since) for name in nodes]

    def _one(self, name: str, info: SlurmNodeInfo | None, since: float) -> NodeReturn:
        if info is None:
            return NodeReturn(node=name, action="left", before=None, detail="not a Slurm node")
        before = describe_node(info)
        if in_service(info):
            return NodeReturn(node=name, action="in service", before=before, detail=info.state)
        backend = self._backend
        try:
            if _cut_off_since(info, since):
                detail = backend.resume_node(name)
                return NodeReturn(node=name, action="resumed", before=before, detail=detail)
            if "NOT_RESPONDING" in info.flags and "DOWN" not in info.state and not drained(info):
                back = backend.wait.node(backend.commands, name, in_service, "back in service")
                detail = f"answering again: {back.state}"
                return NodeReturn(node=name, action="back", before=before, detail=detail)
        except BackendError as exc:
            return NodeReturn(node=name, action="failed", before=before, detail=str(exc))
        why = "drained" if drained(info) else f"out of service for another reason ({before})"
        return NodeReturn(node=name, action="left", before=before, detail=f"{why}: not touched")


def _cut_off_since(info: SlurmNodeInfo, since: float) -> bool:
    """DOWN (not drained) by slurmctld for not answering, at or after ``since`` (Unix s)."""
    if "DOWN" not in info.state or drained(info) or info.reason_text != NOT_RESPONDING_REASON:
        return False
    stamped = info.reason_time
    return stamped is None or stamped >= since - _STAMP_RESOLUTION_S


__all__ = ["NOT_RESPONDING_REASON", "NodeReturn", "NodeService", "SlurmNodes"]
