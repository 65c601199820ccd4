"""Post-mortem of an experiment run: timeline, time to detect/recover, steps lost, loss check.

Inputs are recorded files only (so a post-mortem can be rebuilt, and tested):
the journal (when the fault was injected), the job's rank logs (restarts,
resume step, losses), a fault-free baseline job's rank-0 log (``loss_hex`` per
step) and the :class:`~stormwatch.chaos.reports.evidence.Evidence` collected from
Prometheus and the responder. Writes ``postmortem.md`` and ``postmortem.json``
next to the journal.

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

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.chaos.reports.evidence import AlertEvidence, Evidence
from stormwatch.chaos.reports.postmortem_markdown import alert_name, format_clock, render_markdown
from stormwatch.contracts.journal import Journal
from stormwatch.faults import ExperimentFault
from stormwatch.trainer.telemetry.events import StartEvent, StepEvent
from stormwatch.trainer.telemetry.ranklogs import RankLog, final_losses

#: Clock slack (s) when matching an alert or notification to a fault: the agent,
#: Prometheus and the responder stamp times on the same host but at different moments.
MATCH_SLACK_SECONDS = 1.0


class TimelineEvent(BaseModel):
    """One line of the timeline; ``at`` None means "not observed"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: float | None
    event: str
    source: str
    detail: str = ""


class LossMismatch(BaseModel):
    """A step whose loss differs from the baseline's (``*_hex`` is ``float.hex``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int
    baseline_hex: str
    experiment_hex: str


class LossCheck(BaseModel):
    """Loss after recovery vs. the baseline; ``identical`` None when nothing could be compared."""

    model_config = ConfigDict(extra="forbid")

    baseline: str | None = None
    from_step: int | None = None
    compared_steps: int = 0
    identical: bool | None = None
    mismatches: list[LossMismatch] = Field(default_factory=list)
    missing_in_baseline: list[int] = Field(default_factory=list)
    note: str = ""


class PostMortem(BaseModel):
    """The post-mortem (``postmortem.json``); ``None`` fields were not observed."""

    model_config = ConfigDict(extra="forbid")

    experiment_id: str
    title: str
    status: str
    hypothesis_held: bool
    rollbacks_ok: bool | None
    job: str | None = None
    fault_id: str | None = None
    fault_kind: str | None = None
    fault_rank: int | None = None
    fault_node: str | None = None
    fault_at: float | None = None
    alertname: str | None = None
    alert_labels: dict[str, str] = Field(default_factory=dict)
    alert_firing_at: float | None = None
    alert_received_at: float | None = None
    alert_resolved_at: float | None = None
    workers_restarted_at: float | None = None
    recovered_at: float | None = None
    detected: bool = False
    time_to_detect_seconds: float | None = None
    recovered: bool = False
    recovered_by: Literal["restart", "fault removed"] | None = None
    time_to_recover_seconds: float | None = None
    last_step_before_fault: int | None = None
    resumed_from_step: int | None = None
    first_step_after_resume: int | None = None
    steps_lost: int | None = None
    loss: LossCheck = Field(default_factory=LossCheck)
    loss_plot: str | None = None
    faults_left_open: list[str] = Field(default_factory=list)
    timeline: list[TimelineEvent] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def analyze(
    journal: Journal,
    logs: dict[int, RankLog],
    *,
    evidence: Evidence | None,
    baseline: RankLog | None,
    baseline_name: str | None = None,
) -> PostMortem:
    """Build the post-mortem from recorded inputs (never raises for missing pieces: see ``notes``)."""
    pm = PostMortem(
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
    _fault(pm, journal)
    fault_attempt = _restart(pm, logs)
    if not pm.recovered:
        _removed(pm, journal, logs)
    _alert(pm, evidence)
    pm.loss = _loss(pm, logs.get(0), baseline, baseline_name, fault_attempt)
    pm.timeline = _timeline(pm, journal)
    _notes(pm, evidence, journal)
    return pm


def _fault(pm: PostMortem, journal: Journal) -> None:
    for record in journal.method:
        fault = record.fault_injected() if record.type == "action" else None
        if fault is not None:
            pm.fault_id, pm.fault_kind = fault.fault_id, fault.kind
            pm.fault_rank, pm.fault_node = fault.rank, fault.node
            pm.fault_at = fault.applied_at
            return


def _restart(pm: PostMortem, logs: dict[int, RankLog]) -> int | None:
    """Fill the restart/recovery fields; returns the attempt the job was in at fault time."""
    if pm.fault_at is None or not logs:
        return None
    t0 = pm.fault_at
    attempt = max(log.attempt_at(t0) for log in logs.values())
    before = [
        e.step for log in logs.values() for e in log.steps if e.time <= t0 and e.step is not None
    ]
    pm.last_step_before_fault = max(before) if before else None
    restarted = {rank: log.since_restart(t0) for rank, log in logs.items()}
    # Each non-empty list begins with the start event of the incarnation after the fault.
    starts = sorted(
        (e for events in restarted.values() for e in events[:1] if isinstance(e, StartEvent)),
        key=lambda e: e.time,
    )
    if starts:
        pm.workers_restarted_at = starts[0].time
        pm.resumed_from_step = starts[0].resumed_from_step or 0
    steps = sorted(
        (e for events in restarted.values() for e in events if isinstance(e, StepEvent)),
        key=lambda e: e.time,
    )
    if steps:
        pm.recovered, pm.recovered_at = True, steps[0].time
        pm.recovered_by = "restart"
        pm.first_step_after_resume = steps[0].step
        pm.time_to_recover_seconds = max(0.0, steps[0].time - t0)
    if pm.last_step_before_fault is not None and pm.resumed_from_step is not None:
        pm.steps_lost = max(0, pm.last_step_before_fault - pm.resumed_from_step)
    return attempt


def _removed(pm: PostMortem, journal: Journal, logs: dict[int, RankLog]) -> None:
    """Recovery of a fault that did not restart the job: every rank steps after its revert."""
    if pm.fault_at is None or not logs:
        return
    # A fault ends at its revert, or at its TTL when that came first (the agent, or the
    # reaper, reverted it then; the ledger row is closed later, by the rollback).
    ends = [min(f.reverted_at, f.expires_at) for f in journal.faults if f.reverted_at is not None]
    if not ends or any(f.open for f in journal.faults):
        return
    cleared = max(ends)
    firsts = []
    for log in logs.values():
        after = [e.time for e in log.steps if e.time > cleared]
        if not after and log.finished and log.done_at <= cleared:
            continue  # this rank had finished before the fault was removed
        if not after:
            return
        firsts.append(min(after))
    if firsts:
        pm.recovered, pm.recovered_by = True, "fault removed"
        pm.recovered_at = max(firsts)
        pm.time_to_recover_seconds = max(0.0, pm.recovered_at - pm.fault_at)


def _alert(pm: PostMortem, evidence: Evidence | None) -> None:
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
    elif incident is not None:  # Prometheus said nothing, the responder knows when it started
        pm.alertname, pm.alert_labels = incident.alertname, incident.labels
        pm.alert_firing_at = incident.starts_at
    if pm.alert_firing_at is not None:
        pm.detected = True
        pm.time_to_detect_seconds = max(0.0, pm.alert_firing_at - pm.fault_at)
    if incident is not None:
        firing = [
            n
            for n in evidence.notifications
            if n.status == "firing" and n.group_key == incident.group_key and n.received_at >= t0
        ]
        pm.alert_received_at = min((n.received_at for n in firing), default=incident.opened_at)
        if incident.closed_at is not None:
            pm.alert_resolved_at = incident.closed_at


def _about(labels: dict[str, str], pm: PostMortem) -> bool:
    """An alert is about the experiment when it names no other job (and no other rank)."""
    if "job" in labels and pm.job is not None and labels["job"] != pm.job:
        return False
    return not (
        "rank" in labels and pm.fault_rank is not None and labels["rank"] != str(pm.fault_rank)
    )


def _best(alerts: list[AlertEvidence], pm: PostMortem) -> AlertEvidence | None:
    about = [a for a in alerts if _about(a.labels, pm)]
    exact = [a for a in about if a.labels.get("job") == pm.job]
    # An alert that names the faulted rank says more than a job-level one that fired first.
    named = [
        a for a in exact if pm.fault_rank is not None and a.labels.get("rank") == str(pm.fault_rank)
    ]
    pool = named or exact or about
    return min(pool, key=lambda a: a.firing_at) if pool else None


def _loss(
    pm: PostMortem,
    rank0: RankLog | None,
    baseline: RankLog | None,
    name: str | None,
    fault_attempt: int | None,
) -> LossCheck:
    check = LossCheck(baseline=name)
    if baseline is None:
        check.note = "no baseline run given"
        return check
    if rank0 is None:
        check.note = "the experiment's rank-0 log is missing"
        return check
    expected = final_losses(baseline)
    if pm.fault_at is not None and fault_attempt is not None:
        if pm.resumed_from_step is None:
            check.note = "the workers did not restart: no steps after recovery to compare"
            return check
        check.from_step = pm.resumed_from_step + 1
        events = [e for e in rank0.since_restart(pm.fault_at) if isinstance(e, StepEvent)]
    else:
        check.from_step = 1
        events = rank0.steps
    actual: dict[int, str] = {}
    for event in events:
        if event.step is not None and event.loss_hex is not None and event.step >= check.from_step:
            actual[event.step] = event.loss_hex
    for step in sorted(actual):
        if step not in expected:
            check.missing_in_baseline.append(step)
        elif expected[step] != actual[step]:
            check.mismatches.append(
                LossMismatch(step=step, baseline_hex=expected[step], experiment_hex=actual[step])
            )
    check.compared_steps = len(actual) - len(check.missing_in_baseline)
    if check.compared_steps == 0:
        check.note = "no step after recovery has a loss in both runs"
        return check
    check.identical = not check.mismatches
    return check


def _timeline(pm: PostMortem, journal: Journal) -> list[TimelineEvent]:
    events = [
        TimelineEvent(
            at=journal.started_at,
            event="experiment started",
            source="journal",
            detail=journal.title,
        )
    ]
    before = journal.steady_state_before
    if before.probes and before.probes[-1].end is not None:
        events.append(
            TimelineEvent(
                at=before.probes[-1].end,
                source="journal",
                event="steady state before: " + ("held" if before.met else "did NOT hold"),
            )
        )
    fault_detail = ""
    for fault in journal.injected_faults()[:1]:
        fault_detail = fault.detail
        fault_detail += f" (after step {fault.step})" if fault.step is not None else ""
    events += [
        TimelineEvent(
            at=pm.fault_at, event="fault injected", source="journal", detail=fault_detail
        ),
        TimelineEvent(
            at=pm.alert_firing_at, event="alert firing", source="prometheus", detail=alert_name(pm)
        ),
        TimelineEvent(
            at=pm.alert_received_at,
            event="alert received by the responder",
            source="responder",
            detail=alert_name(pm),
        ),
        TimelineEvent(
            at=pm.workers_restarted_at,
            event="workers restarted",
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
    ]
    after = journal.steady_state_after
    if after.probes and after.probes[-1].end is not None:
        events.append(
            TimelineEvent(
                at=after.probes[-1].end,
                source="journal",
                event="steady state after: " + ("held" if after.met else "did NOT hold"),
            )
        )
    events.append(
        TimelineEvent(
            at=pm.alert_resolved_at,
            event="alert resolved",
            source="responder/prometheus",
            detail=alert_name(pm),
        )
    )
    events.append(
        TimelineEvent(
            at=journal.ended_at, event="experiment ended", source="journal", detail=journal.status
        )
    )
    seen = [e for e in events if e.at is not None]
    return sorted(seen, key=lambda e: e.at or 0.0) + [e for e in events if e.at is None]


def _notes(pm: PostMortem, evidence: Evidence | None, journal: Journal) -> None:
    notes = pm.notes
    if journal.error:
        notes.append(f"the experiment {journal.status}: {journal.error}")
    if pm.fault_at is None:
        notes.append("no fault was injected (see the journal): nothing to detect or recover from")
        return
    if evidence is None:
        notes.append("no alert/responder evidence was collected: detection unknown")
    else:
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


def write_postmortem(pm: PostMortem, experiment_dir: Path) -> tuple[Path, Path]:
    """Write ``postmortem.md`` and ``postmortem.json`` into ``experiment_dir``; returns both paths."""
    md, js = experiment_dir / "postmortem.md", experiment_dir / "postmortem.json"
    md.write_text(render_markdown(pm), encoding="utf-8")
    js.write_text(pm.model_dump_json(indent=2), encoding="utf-8")
    return md, js


def _where(spec: ExperimentFault) -> str:
    """``rank R`` or ``node N`` (or both nodes of a partition) for a fault's one-line description."""
    rank = spec.target_rank()
    if rank is not None:
        return f"rank {rank}"
    nodes = spec.target_nodes()
    return f"node {', '.join(nodes)}" if nodes else "job-wide"


__all__ = [
    "LossCheck",
    "LossMismatch",
    "PostMortem",
    "TimelineEvent",
    "analyze",
    "format_clock",
    "render_markdown",
    "write_postmortem",
]
