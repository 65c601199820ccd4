"""The post-mortem of a chaos experiment (``postmortem.json`` beside its journal) and its layout.

:class:`ExperimentPostMortem` is the record the experiment source
(:mod:`stormwatch.chaos.reports.experiment_report`) fills from the journal, the rank
logs, a baseline run and the alert/responder evidence, and that readers
(``stormwatch plan``, game days) load back; :func:`experiment_document`
lays it out: Summary, Timeline, Loss after recovery, Faults, Notes. Times are Unix
seconds; ``None`` means "not observed" (the reason is in ``notes``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from stormwatch.contracts.labels import TRAINING_JOB_LABEL
from stormwatch.postmortem.causes import RestartFailure
from stormwatch.postmortem.document import (
    Block,
    Bullets,
    Document,
    Figure,
    KeyValues,
    Paragraph,
    Section,
    Table,
)
from stormwatch.postmortem.measures import LossCheck, older_restart_count
from stormwatch.postmortem.text import (
    alert_label,
    format_clock,
    format_optional,
    format_seconds,
)
from stormwatch.postmortem.timeline import TimelineEvent, timeline_table

#: The labels an experiment's alert is named by (its node is the fault's, shown apart).
EXPERIMENT_ALERT_KEYS = (TRAINING_JOB_LABEL, "rank", "phase", "severity")
RecoveredBy = Literal["restart", "fault removed"]


class ExperimentPostMortem(BaseModel):
    """The post-mortem of one experiment run (``postmortem.json``).

    Attributes:
        experiment_id / title / status / hypothesis_held / rollbacks_ok / job: the run.
        fault_*: the first fault the method injected (``fault_at``: the agent's ``applied_at``).
        alertname / alert_labels / alert_firing_at / alert_received_at / alert_resolved_at:
            the alert about the job that fired after the fault, and when the responder
            received it and it resolved; ``alert_resolved_source``: who saw it resolve
            (``prometheus``; ``responder``, its incident's close, when Prometheus did not).
        workers_restarted_at / recovered_at / recovered_by: the recovery (a restarted
            worker's first step, or every rank stepping after the fault was removed).
        time_to_detect_seconds / time_to_recover_seconds: fault -> alert firing, fault ->
            recovery.
        last_step_before_fault / resumed_from_step / first_step_after_resume / steps_lost:
            the steps computed again.
        restart_count: the restart's job attempt, a number (None: not known); ``restart``:
            the same in words, beside the node-local counts and the nodes whose failure
            caused it.
        loss: the loss after recovery against the baseline; ``loss_plot``: its figure.
        faults_left_open: ledger entries of the experiment not reverted.
        processes_reaped: processes a fault left behind (``kill_torchrun``'s orphaned
            ranks) and what removed each (their exit, or the revert's stop), per fault.
        restart_failure: why a restart after the fault itself failed (``port conflict on
            restart``: a dump after the fault with errno ``EADDRINUSE``;
            :func:`stormwatch.postmortem.causes.restart_failure`), None when none did.
    """

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _older_files(cls, data: Any) -> Any:
        return older_restart_count(data)

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
    alert_resolved_source: Literal["prometheus", "responder"] | None = None
    workers_restarted_at: float | None = None
    recovered_at: float | None = None
    detected: bool = False
    time_to_detect_seconds: float | None = None
    recovered: bool = False
    recovered_by: RecoveredBy | None = None
    time_to_recover_seconds: float | None = None
    last_step_before_fault: int | None = None
    resumed_from_step: int | None = None
    first_step_after_resume: int | None = None
    steps_lost: int | None = None
    restart_count: int | None = None
    restart: str | None = None
    loss: LossCheck = Field(default_factory=LossCheck)
    loss_plot: str | None = None
    faults_left_open: list[str] = Field(default_factory=list)
    processes_reaped: list[str] = Field(default_factory=list)
    restart_failure: RestartFailure | None = None
    timeline: list[TimelineEvent] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def alert_name(pm: ExperimentPostMortem) -> str:
    """``Name{training_job=..., rank=..., severity=...}`` of the post-mortem's alert ("" when
    none)."""
    if pm.alertname is None:
        return ""
    return alert_label(pm.alertname, pm.alert_labels, EXPERIMENT_ALERT_KEYS)


def recovery_event(pm: ExperimentPostMortem) -> str:
    """What ended the recovery, in words."""
    if pm.recovered_by == "fault removed":
        return "every rank stepping after the fault's removal"
    return "first step after resume"


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "**no**")


def _summary(pm: ExperimentPostMortem) -> KeyValues:
    loss = pm.loss
    rank = pm.fault_rank if pm.fault_rank is not None else "—"
    compared = (
        f"{_yes_no(loss.identical)} ({loss.compared_steps} steps compared"
        + (f" from step {loss.from_step}" if loss.from_step is not None else "")
        + (f", baseline `{loss.baseline}`" if loss.baseline else "")
        + ")"
    )
    return KeyValues(
        [
            (
                "fault",
                f"{pm.fault_kind or '—'} rank {rank} on {pm.fault_node or '—'} "
                f"at {format_clock(pm.fault_at)}",
            ),
            ("alert", alert_name(pm) or "none"),
            (
                "time to detect (fault → alert firing)",
                format_seconds(pm.time_to_detect_seconds, "not detected"),
            ),
            (
                f"time to recover (fault → {recovery_event(pm)})",
                format_seconds(pm.time_to_recover_seconds, "not recovered"),
            ),
            ("last step before the fault", format_optional(pm.last_step_before_fault)),
            ("restart count (job; node-local)", pm.restart or "—"),
            (
                "restart failure",
                pm.restart_failure.cause if pm.restart_failure is not None else "none seen",
            ),
            ("resumed from step", format_optional(pm.resumed_from_step)),
            ("steps lost", format_optional(pm.steps_lost)),
            ("loss identical to baseline after recovery", compared),
        ]
    )


def _loss(pm: ExperimentPostMortem) -> list[Block]:
    loss = pm.loss
    blocks: list[Block] = []
    if pm.loss_plot:
        caption = "loss per step, experiment vs baseline"
        blocks.append(Figure(pm.loss_plot, title=caption, caption=caption, name="loss"))
    if loss.identical is None:
        blocks.append(Paragraph(f"Not compared: {loss.note}"))
    elif loss.identical:
        blocks.append(
            Paragraph(
                f"Bitwise identical to the baseline at all {loss.compared_steps} steps "
                f"from step {loss.from_step} (`loss_hex`, rank 0)."
            )
        )
    else:
        blocks += [
            Paragraph(
                f"**{len(loss.mismatches)} of {loss.compared_steps} steps differ** "
                "from the baseline:"
            ),
            Table(
                ("step", "baseline", "experiment"),
                [
                    (str(m.step), f"`{m.baseline_hex}`", f"`{m.experiment_hex}`")
                    for m in loss.mismatches
                ],
            ),
        ]
    if loss.missing_in_baseline:
        missing = ", ".join(str(s) for s in loss.missing_in_baseline)
        blocks.append(Paragraph(f"Steps missing from the baseline: {missing}"))
    return blocks


def _reaped(pm: ExperimentPostMortem) -> list[Block]:
    if not pm.processes_reaped:
        return []
    return [
        Paragraph("Processes the faults left behind, and what removed them:"),
        Bullets(pm.processes_reaped),
    ]


def experiment_document(pm: ExperimentPostMortem) -> Document:
    """The experiment's report: Summary, Timeline, Loss after recovery, Faults (and Notes)."""
    faults: Block = (
        Bullets([f"**still open**: {f}" for f in pm.faults_left_open])
        if pm.faults_left_open
        else Paragraph("Every fault of this experiment is reverted in the ledger.")
    )
    sections = [
        Section("Summary", [_summary(pm)]),
        Section("Timeline", [timeline_table(pm.timeline, pm.fault_at, "fault")]),
        Section("Loss after recovery", _loss(pm)),
        Section("Faults", [faults, *_reaped(pm)]),
    ]
    if (failure := pm.restart_failure) is not None:
        sections.insert(2, Section(f"Restart failed: {failure.cause}", [Bullets(failure.evidence)]))
    if pm.notes:
        sections.append(Section("Notes", [Bullets(pm.notes)]))
    lead = Paragraph(
        lead=True,
        text=f"Experiment `{pm.experiment_id}` on job `{pm.job or '—'}`: status **{pm.status}**; "
        f"steady-state hypothesis held: {_yes_no(pm.hypothesis_held)}; "
        f"rollbacks succeeded: {_yes_no(pm.rollbacks_ok)}.",
    )
    return Document(title=f"Post-mortem: {pm.title}", lead=[lead], sections=sections)


__all__ = [
    "EXPERIMENT_ALERT_KEYS",
    "ExperimentPostMortem",
    "RecoveredBy",
    "alert_name",
    "experiment_document",
    "recovery_event",
]
