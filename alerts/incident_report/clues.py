"""The incident's evidence about its culprit, reduced to the engine's neutral clues.

What the engine weighs (:func:`stormwatch.postmortem.find_culprit`, strongest first:
flight recorder, rank exits, the first alert, straggler scores, heartbeats, XID
errors) comes from files and services this source reads: the trainer's dumps
(:class:`~stormwatch.telemetry.dump.DumpRecord` ->
:func:`stormwatch.telemetry.culprit.reduce_dump`), the
agents' ``rank_exit`` events (:func:`exit_status` words them), ``rank_hang`` events (the
phase a rank hung in) and ``rank_hang_culprit``
events (their diagnosis while the hang lasted), the responder's first
alert, Prometheus and the rank logs.
"""

from __future__ import annotations

from collections.abc import Sequence

from stormwatch.agent.watch.events import RankExitEvent, RankHangCulpritEvent, RankHangEvent
from stormwatch.agent.watch.proc_exits import signal_name
from stormwatch.alerts.actions.remedial import EVIDENCE_WAIT_S, HANG_ALERTS, RANK_STOPPING_KINDS
from stormwatch.alerts.incident_report.sources import Inputs
from stormwatch.postmortem import Clues, FirstAlert, HangDiagnosis, RankDump, RankExit, RankHang
from stormwatch.telemetry.culprit import REASON_CHARS, reduce_dump


def exit_status(event: RankExitEvent) -> str:
    """How a ``rank_exit`` agent event says the rank ended, in words.

    ``killed by SIGKILL`` (``exit_signal``, or a negative ``exit_code``), ``exited with code
    143 (128 + SIGTERM: the process ended itself on that signal)``, ``exited with code 1``,
    or ``exited (status unknown: the agent saw no exit event)``.
    """
    code, sig = event.exit_code, event.exit_signal
    if sig:
        return f"was killed by {sig}"
    if code is not None and code < 0:
        return f"was killed by {signal_name(-code)}"
    if code is not None and code > 128:
        return (
            f"exited with code {code} (128 + {signal_name(code - 128)}: "
            "the process ended itself on that signal)"
        )
    if code is not None:
        return f"exited with code {code}"
    return "exited (status unknown: the agent saw no exit event)"


def culprit_exits(events: Sequence[object]) -> list[RankExit]:
    """The agents' rank exits that may name a culprit: unclean ones, except those the agent
    classified as a stop (``reason="stopped"``: the rank was asked to stop, by torchrun
    ending the siblings of a failed rank, a cancel or a requeue; a consequence, not a
    clue). The demo's kill of rank 1 was called "uncertain" because rank 0's stop by
    torchrun came 0.47 s after it, inside the tie window."""
    return [
        RankExit(
            e.time,
            e.rank,
            e.node,
            exit_status(e),
            killed=e.exit_code is not None and e.exit_code < 0,
        )
        for e in events
        if isinstance(e, RankExitEvent) and not e.clean and e.reason != "stopped"
    ]


def stop_started_at(inputs: Inputs) -> float | None:
    """When the responder began to stop the job's ranks (its first action of a
    :data:`RANK_STOPPING_KINDS` kind, e.g. a restart); None without one. What the ranks do
    and show from then on is that action's doing, not the incident's.

    An action starts when the responder claims it, but one that stops ranks for a hang
    alert (:data:`HANG_ALERTS`) first waits until :data:`EVIDENCE_WAIT_S` after the alert
    started firing (its precheck, while the agents collect the hung ranks' dumps): it
    signals no rank before then (breaker: the claim's time put the ranks' SIGTERM dumps
    7 s after the "stop")."""
    stops = [
        a.started_at
        for a in inputs.actions
        if a.kind in RANK_STOPPING_KINDS and a.started_at is not None
    ]
    first = min(stops, default=None)
    if first is not None and inputs.incident.alertname in HANG_ALERTS:
        first = max(first, inputs.incident.starts_at + EVIDENCE_WAIT_S)
    return first


def clues_of(inputs: Inputs, dumps: list[RankDump], onset: float | None) -> Clues:
    """The engine's clues from what was read about the incident (``dumps`` compared)."""
    first = inputs.incident.first_alert
    return Clues(
        progress=inputs.progress,
        dumps=dumps,
        first_alert=FirstAlert(first.alertname, first.labels, inputs.incident.first_alert_tied),
        first_alert_at=inputs.incident.starts_at,
        onset=onset,
        rank_exits=culprit_exits(inputs.agent_events),
        hang_diagnoses=[
            HangDiagnosis(e.time, e.rank, e.node, bool(e.certain), tuple(e.evidence or ()))
            for e in inputs.agent_events
            if isinstance(e, RankHangCulpritEvent)
        ],
        straggler_scores=inputs.prometheus_now.get("straggler_score", {}),
        xid_errors=inputs.prometheus_now.get("xid_errors", {}),
        rank_nodes=inputs.rank_nodes,
        chaos_fault_ranks=[f.rank for j in inputs.journals for f in j.injected_faults()],
        stopped_at=stop_started_at(inputs),
        rank_hangs=[
            RankHang(e.time, e.rank, e.node, e.phase)
            for e in inputs.agent_events
            if isinstance(e, RankHangEvent)
        ],
    )


__all__ = ["REASON_CHARS", "clues_of", "exit_status", "reduce_dump", "stop_started_at"]
