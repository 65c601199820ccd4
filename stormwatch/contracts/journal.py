"""The experiment journal, ``<run-dir>/experiments/<experiment-id>/journal.json``.

Writer: the chaos runner (:mod:`stormwatch.chaos.execution`), through
:class:`~stormwatch.chaos.execution.journal_writer.JournalWriter`, which calls
:func:`write_journal` after every activity, atomically (temporary file + rename), so a
crashed controller still leaves the journal of what it did. Readers load it with
:func:`load_journal`: the experiment post-mortem and verification (chaos reports, game
days) and the incident post-mortem (alerts), which reads the journals that overlap an
incident; the journal is the contract across that line, so it is declared here, in the
shared home.

One record per activity (start, end, status, output, error). The output of a fault
injection, which readers look into, is typed (:class:`FaultInjected`,
:meth:`ActivityRecord.fault_injected`), and so is what readers take from the recorded
experiment (:class:`ExperimentFacts`, :meth:`Journal.facts`). The ledger rows it embeds
are :mod:`stormwatch.contracts.fault_ledger`. All times are Unix seconds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from stormwatch.contracts.fault_ledger import LedgerEntry

ActivityStatus = Literal["running", "succeeded", "failed", "skipped", "aborted"]
ExperimentStatus = Literal["running", "completed", "deviated", "failed", "aborted"]
Phase = Literal["recovery", "warmup", "before", "method", "after", "rollbacks", "cleanup"]


class FaultInjected(BaseModel):
    """The ``output`` of a method ``action`` that injected a fault (keys in file order).

    Attributes:
        fault_id: its fault ledger id.
        kind: the fault kind (``kill_rank`` ...).
        rank / node: where it was injected (``rank`` None for node faults).
        target_pid: the process it hit, when one.
        applied_at / expires_at: when it took effect, and its TTL's end (Unix seconds).
        step / attempt: the rank's step and attempt it waited for (``when``), if any.
        detail: what the agent or controller said it did.
        background: the activity did not wait for the fault to end.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    fault_id: str | None = None
    kind: str | None = None
    rank: int | None = None
    node: str | None = None
    target_pid: int | None = None
    applied_at: float
    expires_at: float | None = None
    step: int | None = None
    attempt: int | None = None
    detail: str = ""
    background: bool = False


class ActivityRecord(BaseModel):
    """What one activity did.

    Attributes:
        name: the activity's name from the experiment (or a built-in step's name).
        type: ``action``, ``probe``, ``pause``, ``revert``, ``wait`` or ``resume`` (nodes
            returned to service after a revert).
        phase: where in the experiment it ran.
        status: ``succeeded``, ``failed`` (ran, the condition or fault failed),
            ``skipped`` (not run), ``aborted`` (interrupted), ``running`` (journal
            written mid-activity).
        start / end: Unix seconds.
        output: what it observed or did (JSON).
        error: why it failed, when it did.
        span_id: the activity's OpenTelemetry span (hex) in the journal's ``trace_id``.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    type: str
    phase: Phase
    status: ActivityStatus = "running"
    start: float
    end: float | None = None
    output: JsonValue = None
    error: str | None = None
    span_id: str | None = None

    @property
    def duration(self) -> float | None:
        return None if self.end is None else self.end - self.start

    def fault_injected(self) -> FaultInjected | None:
        """The fault this activity injected: its output when that names an ``applied_at``
        (None for any other activity, or an output that does not parse)."""
        out = self.output
        if not isinstance(out, dict) or out.get("applied_at") is None:
            return None
        try:
            return FaultInjected.model_validate(out)
        except ValidationError:
            return None


class SteadyState(BaseModel):
    """The hypothesis check of one phase; ``met`` is None when it was not checked."""

    model_config = ConfigDict(extra="forbid")

    met: bool | None = None
    probes: list[ActivityRecord] = Field(default_factory=list)


class JobRef(BaseModel):
    """The training job the experiment ran against."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    log_dir: Path
    world_size: int
    started_by_runner: bool


class ExperimentExpectations(BaseModel):
    """The ``expect`` section of the recorded experiment, as readers use it (the runner
    records the whole experiment, ``stormwatch.chaos.experiment.model.Experiment``).

    Attributes:
        loss: ``identical``, ``bounded`` or ``skip`` (None: not said).
        loss_rel_tolerance: the relative bound of ``bounded`` (None: not said).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    loss: str | None = None
    loss_rel_tolerance: float | None = None


class ExperimentJobSettings(BaseModel):
    """The ``job`` section of the recorded experiment, as readers use it.

    Attributes:
        checkpoint_every: steps between two checkpoints of a job the runner started.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    checkpoint_every: int | None = None


class ExperimentFacts(BaseModel):
    """What readers take from ``Journal.experiment`` (the experiment file as JSON; every
    other key is ignored here)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    job: ExperimentJobSettings | None = None
    expect: ExperimentExpectations | None = None


class Journal(BaseModel):
    """Everything one experiment run did.

    Attributes:
        experiment: the experiment file as the runner recorded it (JSON); readers take
            what they use through :meth:`facts`.
        status: ``completed`` (hypothesis held before and after), ``deviated``
            (it did not hold after), ``failed`` (not held before, or an activity or
            the controller failed), ``aborted`` (interrupted), ``running``.
        rollbacks_ok: every rollback and the final revert of this experiment's
            faults succeeded (None: not run yet).
        faults: this experiment's ledger entries at the end.
        trace_id: the experiment's OpenTelemetry trace (hex; spans in ``spans.jsonl``
            beside the journal, or sent to ``STORMWATCH_OTLP_ENDPOINT``).
    """

    model_config = ConfigDict(extra="forbid")

    experiment_id: str
    title: str
    file: Path
    experiment: JsonValue
    status: ExperimentStatus = "running"
    started_at: float
    ended_at: float | None = None
    job: JobRef | None = None
    recovery: list[ActivityRecord] = Field(default_factory=list)
    warmup: list[ActivityRecord] = Field(default_factory=list)
    steady_state_before: SteadyState = Field(default_factory=SteadyState)
    method: list[ActivityRecord] = Field(default_factory=list)
    steady_state_after: SteadyState = Field(default_factory=SteadyState)
    rollbacks: list[ActivityRecord] = Field(default_factory=list)
    cleanup: list[ActivityRecord] = Field(default_factory=list)
    rollbacks_ok: bool | None = None
    faults: list[LedgerEntry] = Field(default_factory=list)
    error: str | None = None
    trace_id: str | None = None

    @property
    def hypothesis_held(self) -> bool:
        """Held before *and* after the method."""
        return bool(self.steady_state_before.met) and bool(self.steady_state_after.met)

    @property
    def succeeded(self) -> bool:
        """The run's verdict: completed, hypothesis held, rollbacks (and reverts) succeeded."""
        return self.status == "completed" and self.hypothesis_held and self.rollbacks_ok is True

    def section(self, phase: Phase) -> list[ActivityRecord]:
        """The list of records of ``phase``."""
        sections: dict[str, list[ActivityRecord]] = {
            "recovery": self.recovery,
            "warmup": self.warmup,
            "before": self.steady_state_before.probes,
            "method": self.method,
            "after": self.steady_state_after.probes,
            "rollbacks": self.rollbacks,
            "cleanup": self.cleanup,
        }
        return sections[phase]

    def facts(self) -> ExperimentFacts:
        """The parts of the recorded experiment readers use (empty when it has none, or
        they do not parse: an experiment recorded by another version)."""
        try:
            return ExperimentFacts.model_validate(self.experiment)
        except ValidationError:
            return ExperimentFacts()

    def injected_faults(self) -> list[FaultInjected]:
        """The faults the method injected, in order (see :meth:`ActivityRecord.fault_injected`)."""
        return [f for r in self.method if (f := r.fault_injected()) is not None]


def write_journal(journal: Journal, path: Path) -> None:
    """Write ``journal`` to ``path`` atomically (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(journal.model_dump_json(indent=2), encoding="utf-8")
    os.replace(tmp, path)


def load_journal(path: Path) -> Journal:
    """Read a journal written by :func:`write_journal`.

    Raises:
        OSError: the file cannot be read.
        ValueError: (pydantic's ``ValidationError``) not a journal of this version.
    """
    return Journal.model_validate_json(Path(path).read_text(encoding="utf-8"))


__all__ = [
    "ActivityRecord",
    "ActivityStatus",
    "ExperimentExpectations",
    "ExperimentFacts",
    "ExperimentJobSettings",
    "ExperimentStatus",
    "FaultInjected",
    "JobRef",
    "Journal",
    "Phase",
    "SteadyState",
    "load_journal",
    "write_journal",
]
