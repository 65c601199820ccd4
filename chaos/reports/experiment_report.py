"""The experiment source of the post-mortem engine: journal, rank logs, baseline, evidence.

Inputs are recorded files only (so a post-mortem can be rebuilt, and tested): the
journal (when the fault was injected), the job's rank logs (restarts, resume step,
losses), a fault-free baseline job's rank-0 log (``loss_hex`` per step) and the
:class:`~stormwatch.chaos.reports.evidence.Evidence` collected from Prometheus and the
responder. :func:`analyze` turns them into :class:`stormwatch.postmortem.ExperimentPostMortem`;
:func:`write_postmortem` writes ``postmortem.md`` and ``postmortem.json`` next to the journal.

Definitions (times are Unix seconds; the fault time is the agent's ``applied_at``):

* time to detect (MTTD): fault -> first ``ALERTS{alertstate="firing"}`` sample of
  an alert about the job (``activeAt`` / the responder's ``startsAt`` when
  Prometheus has no sample); "not detected" when no alert fired after the fault.
* time to recover (MTTR): fault -> first step completed by a restarted worker
  (a ``start`` event after the fault); ``recovered_by`` ``restart``. A fault that
  does not restart the job (a partition that heals, a slowdown, a GPU fault on the
  simulated backend, a killed node agent) recovers when it is removed: fault ->
  the moment every rank of the job has completed a step after the fault ended (the
  ledger's ``reverted_at``, or its ``expires_at`` when the TTL came first: the agent
  reverted it then); ``recovered_by`` ``fault removed``.
* steps lost: last step completed before the fault minus the step the restarted
  workers resumed from (``resumed_from_step`` of their ``start`` event).
* loss identical: every step after the resume step has the same ``loss_hex`` on
  rank 0 as in the baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stormwatch.chaos.reports.evidence import AlertEvidence, Evidence
from stormwatch.contracts.journal import Journal
from stormwatch.contracts.labels import TRAINING_JOB_LABEL
from stormwatch.faults import ExperimentFault
from stormwatch.postmortem import (
    ExperimentPostMortem,
    JobProgress,
    LossCheck,
    RankExit,
    RankProgress,
    TimelineEvent,
    compare_losses,
    elapsed,
    experiment_document,
    restart_after,
    steps_lost,
    write_report,
)
from stormwatch.postmortem.causes import failed_ranks, restart_failure
from stormwatch.postmortem.clues import RankDump
from stormwatch.postmortem.experiment import alert_name
from stormwatch.postmortem.progress import StepDone, last_step, steps_until
from stormwatch.postmortem.text import format_clock
from stormwatch.postmortem.timeline import in_order
from stormwatch.telemetry.ranklogs import RankLog, final_losses, job_progress

#: Clock slack (s) when matching an alert or notification to a fault: the agent,
#: Prometheus and the responder stamp times on the same host but at different moments.
MATCH_SLACK_SECONDS = 1.0


def analyze(
    journal: Journal,
    logs: dict[int, RankLog],
    *,
    evidence: Evidence | None,
    baseline: RankLog | None,
    baseline_name: str | None = None,
    dumps: Sequence[RankDump] = (),
) -> ExperimentPostMortem:
    """Build the post-mortem from recorded inputs (never raises for missing pieces: see ``notes``).

    ``dumps``: the job's flight-recorder dumps of every attempt (a restart that failed on a
    taken port is reported from them: :func:`~stormwatch.postmortem.causes.restart_failure`).
    """
    pm = ExperimentPostMortem(
        experiment_id=journal.experiment_id,
        title=journal.title,
        status=journal.status,
        hypothesis_held=journal.hypothesis_held,
        rollbacks_ok=journal.rollbacks_ok,
        job=journal.job.name if journal.job else None,
    )
    pm.faults_left_open = [
        f"{f.id} ({f.kind} {_where(f.spec)}, {f.state})" for f in journal.faults if f.open
    ]
    pm.processes_reaped = [
        f"{f.id} ({f.kind}): {f.revert_detail}"
        for f in journal.faults
        if f.revert_detail and "orphaned " in f.revert_detail
    ]
    progress = job_progress(logs)
    _fault(pm, journal)
    _restart(pm, progress)
    if pm.fault_at is not None:
        pm.restart_failure = restart_failure(dumps, since=pm.fault_at)
    if not pm.recovered:
        _removed(pm, journal, progress)
    _alert(pm, evidence)
    pm.loss = _loss(pm, progress.get(0), baseline, baseline_name, has_logs=bool(progress))
    pm.timeline = _timeline(pm, journal)
    _notes(pm, evidence, journal)
    return pm


def _fault(pm: ExperimentPostMortem, journal: Journal) -> None:
    for record in journal.method:
        fault = record.fault_injected() if record.type == "action" else None
        if fault is not None:
            pm.fault_id, pm.fault_kind = fault.fault_id, fault.kind
            pm.fault_rank, pm.fault_node = fault.rank, fault.node
            pm.fault_at = fault.applied_at
            return


def _restart(pm: ExperimentPostMortem, progress: JobProgress) -> None:
    """Fill the restart/recovery fields from the workers started after the fault."""
    if pm.fault_at is None or not progress:
        return
    pm.last_step_before_fault = last_step(steps_until(progress, pm.fault_at))
    restart = restart_after(progress, pm.fault_at)
    pm.workers_restarted_at = restart.started_at
    cause = (  # the faulted rank caused the restart when its node is one the restart names
        [RankExit(pm.fault_at, pm.fault_rank, pm.fault_node, f"faulted ({pm.fault_kind})")]
        if pm.fault_rank is not None and pm.fault_node is not None
        else []
    )
    pm.restart_count = restart.job_attempt
    pm.restart = restart.counts(failed_ranks(restart, cause, since=pm.fault_at))
    pm.resumed_from_step = restart.resumed_from_step
    first = restart.first_step
    if first is not None:
        pm.recovered, pm.recovered_at = True, first.time
        pm.recovered_by = "restart"
        pm.first_step_after_resume = first.step
        pm.time_to_recover_seconds = elapsed(pm.fault_at, first.time)
    pm.steps_lost = steps_lost(pm.last_step_before_fault, pm.resumed_from_step)


def _removed(pm: ExperimentPostMortem, journal: Journal, progress: JobProgress) -> None:
    """Recovery of a fault that did not restart the job: every rank steps after its revert."""
    if pm.fault_at is None or not progress:
        return
    # A fault ends at its revert, or at its TTL when that came first (the agent, or the
    # reaper, reverted it then; the ledger row is closed later, by the rollback).
    ends = [min(f.reverted_at, f.expires_at) for f in journal.faults if f.reverted_at is not None]
    if not ends or any(f.open for f in journal.faults):
        return
    cleared = max(ends)
    firsts = []
    for rank in progress.values():
        after = [s.time for s in rank.steps if s.time > cleared]
        if not after and rank.finished and rank.done_at <= cleared:
            continue  # this rank had finished before the fault was removed
        if not after:
            return
        firsts.append(min(after))
    if firsts:
        pm.recovered, pm.recovered_by = True, "fault removed"
        pm.recovered_at = max(firsts)
        pm.time_to_recover_seconds = elapsed(pm.fault_at, pm.recovered_at)


def _alert(pm: ExperimentPostMortem, evidence: Evidence | None) -> None:
    if evidence is None or pm.fault_at is None:
        return
    t0 = pm.fault_at - MATCH_SLACK_SECONDS
    alerts = [a for a in evidence.alerts if a.firing_at >= t0]
    chosen = _best(alerts, pm)
    incidents = [
        i
        for i in evidence.incidents
        if i.opened_at >= t0
        and (chosen is None or i.alertname == chosen.alertname)
        and _about(i.labels, pm)
    ]
    incident = min(incidents, key=lambda i: i.opened_at) if incidents else None
    if chosen is not None:
        pm.alertname, pm.alert_labels = chosen.alertname, chosen.labels
        pm.alert_firing_at, pm.alert_resolved_at = chosen.firing_at, chosen.resolved_at
        pm.alert_resolved_source = "prometheus" if chosen.resolved_at is not None else None
    elif incident is not None:  # Prometheus said nothing, the responder knows when it started
        pm.alertname, pm.alert_labels = incident.alertname, incident.labels
        pm.alert_firing_at = incident.starts_at
    if pm.alert_firing_at is not None:
        pm.detected = True
        pm.time_to_detect_seconds = elapsed(pm.fault_at, pm.alert_firing_at)
    if incident is not None:
        firing = [
            n
            for n in evidence.notifications
            if n.status == "firing" and n.group_key == incident.group_key and n.received_at >= t0
        ]
        pm.alert_received_at = min((n.received_at for n in firing), default=incident.opened_at)
        if pm.alert_resolved_at is None and incident.closed_at is not None:
            # Prometheus did not see it resolve: the responder's close is the nearest fact
            # (when both are known, Prometheus's time is kept, as the responder's own
            # post-mortem reports it; the close comes a notification later)
            pm.alert_resolved_at, pm.alert_resolved_source = incident.closed_at, "responder"


def _about(labels: dict[str, str], pm: ExperimentPostMortem) -> bool:
    """An alert is about the experiment when it names no other training job (and no other
    rank)."""
    job = labels.get(TRAINING_JOB_LABEL)
    if job is not None and pm.job is not None and job != pm.job:
        return False
    return not (
        "rank" in labels and pm.fault_rank is not None and labels["rank"] != str(pm.fault_rank)
    )


def _best(alerts: list[AlertEvidence], pm: ExperimentPostMortem) -> AlertEvidence | None:
    about = [a for a in alerts if _about(a.labels, pm)]
    exact = [a for a in about if a.labels.get(TRAINING_JOB_LABEL) == pm.job]
    # An alert that names the faulted rank says more than a job-level one that fired first.
    named = [
        a for a in exact if pm.fault_rank is not None and a.labels.get("rank") == str(pm.fault_rank)
    ]
    pool = named or exact or about
    return min(pool, key=lambda a: a.firing_at) if pool else None


def _loss(
    pm: ExperimentPostMortem,
    rank0: RankProgress | None,
    baseline: RankLog | None,
    name: str | None,
    *,
    has_logs: bool,
) -> LossCheck:
    if baseline is None:
        return LossCheck(baseline=name, note="no baseline run given")
    if rank0 is None:
        return LossCheck(baseline=name, note="the experiment's rank-0 log is missing")
    steps: list[StepDone] = rank0.steps
    from_step = 1
    if pm.fault_at is not None and has_logs:
        if pm.resumed_from_step is None:
            return LossCheck(
                baseline=name,
                note="the workers did not restart: no steps after recovery to compare",
            )
        from_step = pm.resumed_from_step + 1
        steps = [m for m in rank0.since_restart(pm.fault_at) if isinstance(m, StepDone)]
    return compare_losses(steps, final_losses(baseline), from_step=from_step, baseline=name)


def _timeline(pm: ExperimentPostMortem, journal: Journal) -> list[TimelineEvent]:
    rows = [_steady(journal, "before")]
    fault_detail = ""
    for fault in journal.injected_faults()[:1]:
        fault_detail = fault.detail
        fault_detail += f" (after step {fault.step})" if fault.step is not None else ""
    alert = alert_name(pm)
    rows += [
        TimelineEvent(
            at=pm.fault_at, event="fault injected", source="journal", detail=fault_detail
        ),
        TimelineEvent(
            at=pm.alert_firing_at, event="alert firing", source="prometheus", detail=alert
        ),
        TimelineEvent(
            at=pm.alert_received_at,
            event="alert received by the responder",
            source="responder",
            detail=alert,
        ),
        TimelineEvent(
            at=pm.workers_restarted_at,
            event="restarted workers began training",  # start records: after the load
            source="rank logs",
            detail=f"resuming from step {pm.resumed_from_step}"
            if pm.resumed_from_step is not None
            else "",
        ),
        TimelineEvent(
            at=pm.recovered_at,
            event="first completed step after resume"
            if pm.recovered_by != "fault removed"
            else "every rank stepped after the fault was removed",
            source="rank logs",
            detail=f"step {pm.first_step_after_resume}"
            if pm.first_step_after_resume is not None
            else "",
        ),
        _steady(journal, "after"),
        TimelineEvent(
            at=pm.alert_resolved_at,
            event="alert resolved",
            source=pm.alert_resolved_source or "prometheus",
            detail=alert,
        ),
        TimelineEvent(
            at=journal.ended_at, event="experiment ended", source="journal", detail=journal.status
        ),
    ]
    started = TimelineEvent(
        at=journal.started_at, event="experiment started", source="journal", detail=journal.title
    )
    return in_order([started, *(r for r in rows if r is not None)])


def _steady(journal: Journal, phase: str) -> TimelineEvent | None:
    """When the steady-state check of ``phase`` (``before``/``after``) ended, and its verdict."""
    state = journal.steady_state_before if phase == "before" else journal.steady_state_after
    if not state.probes or state.probes[-1].end is None:
        return None
    verdict = "held" if state.met else "did NOT hold"
    return TimelineEvent(
        at=state.probes[-1].end, source="journal", event=f"steady state {phase}: {verdict}"
    )


def _notes(pm: ExperimentPostMortem, evidence: Evidence | None, journal: Journal) -> None:
    notes = pm.notes
    if journal.error:
        notes.append(f"the experiment {journal.status}: {journal.error}")
    if pm.fault_at is None:
        notes.append("no fault was injected (see the journal): nothing to detect or recover from")
        return
    if evidence is None:
        notes.append("no alert/responder evidence was collected: detection unknown")
    else:
        _evidence_notes(pm, evidence)
    if pm.workers_restarted_at is None:
        notes.append(
            "no worker restart appears in the rank logs"
            + ("; recovered when the fault was removed" if pm.recovered else "")
        )
    elif not pm.recovered:
        notes.append("the workers restarted but completed no step afterwards")
    if pm.loss.note:
        notes.append(pm.loss.note)
    if pm.faults_left_open:
        notes.append("faults still open in the ledger: " + "; ".join(pm.faults_left_open))


def _evidence_notes(pm: ExperimentPostMortem, evidence: Evidence) -> None:
    notes = pm.notes
    if evidence.prometheus_error:
        notes.append(f"Prometheus could not be queried: {evidence.prometheus_error}")
    if evidence.responder_error:
        notes.append(f"the responder could not be queried: {evidence.responder_error}")
    if not pm.detected:
        notes.append(
            f"no alert fired between the fault and "
            f"{format_clock(evidence.window_end)} (MTTD: not detected)"
        )
    elif pm.alert_received_at is None:
        notes.append("the alert fired but the responder has no record of receiving it")
    if pm.detected and pm.alert_resolved_at is None:
        notes.append(f"the alert had not resolved by {format_clock(evidence.window_end)}")


def write_postmortem(pm: ExperimentPostMortem, experiment_dir: Path) -> tuple[Path, Path]:
    """Write ``postmortem.md`` and ``postmortem.json`` into ``experiment_dir``; returns both paths."""
    files = write_report(experiment_dir, pm, experiment_document(pm), html=False)
    return files.markdown, files.json


def _where(spec: ExperimentFault) -> str:
    """``rank R`` or ``node N`` (or both nodes of a partition) for a fault's one-line description."""
    rank = spec.target_rank()
    if rank is not None:
        return f"rank {rank}"
    nodes = spec.target_nodes()
    return f"node {', '.join(nodes)}" if nodes else "job-wide"


__all__ = ["MATCH_SLACK_SECONDS", "analyze", "write_postmortem"]
