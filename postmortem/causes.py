"""What a restart's cause is beside its culprit: the rank that caused it, and why a restart
itself failed.

* The node *and rank* that caused a restart (:func:`failed_ranks`): the rank logs name the
  nodes whose own workers failed before the restart (the start's ``restarted_by``, agreed
  by every rank: :mod:`stormwatch.telemetry.restarts`); within each, the rank is the first
  that the node agent saw end uncleanly (its ``rank_exit`` event, :class:`RankExit`)
  before the restarted workers started. torchrun stops a failed rank's siblings only after
  it saw that rank exit, so the first exit on the node is the cause. A chaos experiment
  knows its own (the faulted rank).
* Port conflict on restart (:data:`PORT_CONFLICT_ON_RESTART`, :func:`restart_failure`): a
  rank of a restarted attempt could not bind a port (its rendezvous store, a listener)
  because a process still held it. Told by the errno the rank's dump records
  (:attr:`RankDump.errno` ``== errno.EADDRINUSE``, from the exception's ``OSError`` or
  torch's ``code: -98``), never by an exception's message text.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.postmortem.clues import RankDump, RankExit
from stormwatch.postmortem.culprit import EXIT_BEFORE_ONSET_S
from stormwatch.postmortem.progress import Restart
from stormwatch.postmortem.text import format_clock

#: The cause a post-mortem reports when a restart failed because a port was taken.
PORT_CONFLICT_ON_RESTART = "port conflict on restart"


class RestartFailure(BaseModel):
    """Why a restart itself failed.

    Attributes:
        cause: in words (:data:`PORT_CONFLICT_ON_RESTART`).
        ranks: the ranks whose attempt failed so, in order.
        evidence: human-readable lines, one per rank.
    """

    model_config = ConfigDict(extra="forbid")

    cause: str
    ranks: list[int] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)


def failed_ranks(
    restart: Restart, exits: Sequence[RankExit], *, since: float | None = None
) -> dict[str, int]:
    """node -> the rank whose failure on it caused ``restart``: per node the restart's first
    start names in ``restarted_by``, the first unclean exit there before the restarted
    workers started and after ``since`` (the onset, less
    :data:`~stormwatch.postmortem.culprit.EXIT_BEFORE_ONSET_S`). When the start names no
    node (a trainer older than ``restarted_by``), only the node of the earliest such exit:
    the other nodes' ranks exited because torchrun stopped them for the restart, and are
    not its cause. Equal times go to the lower rank. In the order the ranks failed; empty
    without a restart or an exit (``exits``: by time or not; times are Unix seconds)."""
    started = restart.started_at
    if started is None:
        return {}
    nodes = set(restart.starts[0].restarted_by)
    found: dict[str, RankExit] = {}
    for exit_ in sorted(exits, key=lambda e: (e.time, e.rank)):
        if exit_.time >= started or (
            since is not None and exit_.time < since - EXIT_BEFORE_ONSET_S
        ):
            continue
        if nodes and exit_.node not in nodes:
            continue
        found.setdefault(exit_.node, exit_)
        if not nodes:  # no node named: the first unclean exit is the cause, and only it
            break
    return {node: e.rank for node, e in found.items()}  # in the order they failed


def port_conflicts(dumps: Iterable[RankDump], *, since: float | None = None) -> list[RankDump]:
    """The dumps (written at or after ``since``, Unix s) of ranks whose attempt ended because
    a port was in use (errno ``EADDRINUSE``), by time."""
    found = [
        d
        for d in dumps
        if d.errno == errno.EADDRINUSE and (since is None or (d.time or 0.0) >= since)
    ]
    return sorted(found, key=lambda d: d.time or 0.0)


def restart_failure(dumps: Iterable[RankDump], *, since: float | None) -> RestartFailure | None:
    """:data:`PORT_CONFLICT_ON_RESTART` when a rank's dump written after ``since`` (the
    onset: a later attempt is a restart) records errno ``EADDRINUSE``; None otherwise."""
    conflicts = port_conflicts(dumps, since=since)
    if not conflicts:
        return None
    return RestartFailure(
        cause=PORT_CONFLICT_ON_RESTART,
        ranks=[d.rank for d in conflicts],
        evidence=[
            f"rank {d.rank}"
            + (f" (attempt {d.attempt})" if d.attempt is not None else "")
            + f" could not bind a port at {format_clock(d.time)}"
            + (f" in {d.phase}" if d.phase else "")
            + f": errno {d.errno} (EADDRINUSE), a process of the previous attempt or another "
            f"program still held it; dump reason: {d.reason[:120] or '?'}"
            for d in conflicts[:5]
        ],
    )


__all__ = [
    "PORT_CONFLICT_ON_RESTART",
    "RestartFailure",
    "failed_ranks",
    "port_conflicts",
    "restart_failure",
]
