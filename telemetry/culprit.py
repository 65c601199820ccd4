"""Post-mortem dumps (:class:`~stormwatch.telemetry.dump.DumpRecord`) as the clues the
post-mortem engine names a culprit from (:class:`stormwatch.postmortem.RankDump`).

The one adapter of the dump format, beside it, shared by whoever reads dumps: the incident
report (:mod:`stormwatch.alerts.incident_report`, after the fact) and the node agent's
hang diagnosis (:mod:`stormwatch.agent.watch.hangdumps`, while the job hangs). No torch.
"""

from __future__ import annotations

from stormwatch.postmortem import RankDump
from stormwatch.telemetry.dump import DumpRecord

#: Characters of a dump's reason kept (an exception message can be a page long).
REASON_CHARS = 300


def reduce_dump(record: DumpRecord) -> RankDump:
    """The parts of one rank's dump that compare across ranks: per process group the last
    collective enqueued and completed, and whether the rank was inside a collective (one
    enqueued but not completed, or one of our own record never observed complete)."""
    dump = RankDump(
        rank=record.rank,
        attempt=record.attempt,
        time=record.time,
        reason=record.reason[:REASON_CHARS],
        errno=record.errno,
        step=record.step,
        phase=record.phase,
    )
    for name, status in record.group_status().items():
        enqueued, completed = status.last_enqueued_collective, status.last_completed_collective
        if enqueued is None:
            continue
        dump.enqueued[name] = enqueued
        if completed is not None:
            dump.completed[name] = completed
        if completed is not None and completed >= 0 and enqueued > completed:
            dump.in_flight = True
    if record.in_collective():
        dump.in_flight = True
    return dump


__all__ = ["REASON_CHARS", "reduce_dump"]
