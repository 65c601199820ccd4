"""stormwatch.postmortem: the one post-mortem engine, shared by experiments and incidents.

A post-mortem says what happened (a merged timeline), how long it took to notice and
to recover (time to detect, time to recover), who did it (the culprit, with its
evidence) and what it cost (steps lost, time and GPU-hours lost, goodput, the loss
against a fault-free baseline), with figures, as Markdown, one self-contained HTML
page and JSON. Two sources feed it, each an adapter beside the data it understands:

* an experiment: :mod:`stormwatch.chaos.reports.experiment_report` (the journal, rank
  logs, a baseline run, the alert/responder evidence) -> :class:`ExperimentPostMortem`;
* a responder incident: :mod:`stormwatch.alerts.incident_report` (the responder's
  records, alerts, agent events, flight-recorder dumps, spans, rank logs, chaos
  journals overlapping the incident) -> :class:`IncidentPostMortem`.

Modules:

* :mod:`.progress`: the job's progress as the engine reads rank logs (``RankProgress``;
  the trainer's log reader makes it), restarts after a moment, steps lost, elapsed times;
* :mod:`.measures`: impact (``Impact``) and the loss check (``LossCheck``);
* :mod:`.clues`, :mod:`.culprit`: the culprit (``Culprit``) from neutral clues (dumps,
  exits, alerts, straggler scores, heartbeats, XIDs), and of a hang in progress from its
  ranks' dumps;
* :mod:`.causes`: the node and rank that caused a restart, and why a restart itself failed
  (``port conflict on restart``, from the errno a rank's dump records);
* :mod:`.timeline`: ``TimelineEvent`` and how rows of many sources merge;
* :mod:`.text`: clock times, durations and alert names as printed;
* :mod:`.experiment`, :mod:`.incident`: the two records (their JSON is the report's
  ``postmortem.json``) and their layouts as a :mod:`.document`;
* :mod:`.markdown`, :mod:`.html`, :mod:`.files`: the renderers and the writer;
* :mod:`.plots`: every figure (matplotlib, imported when drawing).

It imports no component package (its inputs are its own models), and neither
matplotlib nor torch on import. It raises nothing of its own: a source that cannot be
read is the adapter's to report (as a note in the record).
"""

from stormwatch.postmortem.causes import (
    PORT_CONFLICT_ON_RESTART,
    RestartFailure,
    failed_ranks,
    port_conflicts,
    restart_failure,
)
from stormwatch.postmortem.clues import (
    Clues,
    Culprit,
    FirstAlert,
    HangDiagnosis,
    RankDump,
    RankExit,
    RankHang,
)
from stormwatch.postmortem.culprit import (
    DUMP_LEAD_S,
    compare_dumps,
    culprit_from_dumps,
    find_culprit,
    incident_dumps,
)
from stormwatch.postmortem.document import (
    Bullets,
    Document,
    Figure,
    KeyValues,
    Paragraph,
    Section,
    Table,
)
from stormwatch.postmortem.experiment import ExperimentPostMortem, experiment_document
from stormwatch.postmortem.files import ReportFiles, write_atomic, write_report
from stormwatch.postmortem.html import render_html
from stormwatch.postmortem.incident import IncidentPostMortem, PlotRef, incident_document
from stormwatch.postmortem.markdown import render_markdown
from stormwatch.postmortem.measures import (
    Impact,
    LossCheck,
    LossMismatch,
    compare_losses,
    measure_impact,
)
from stormwatch.postmortem.progress import (
    JobProgress,
    RankProgress,
    Restart,
    StepDone,
    WorkerStart,
    elapsed,
    restart_after,
    steps_lost,
)
from stormwatch.postmortem.text import format_clock
from stormwatch.postmortem.timeline import TimelineEvent

__all__ = [
    "DUMP_LEAD_S",
    "PORT_CONFLICT_ON_RESTART",
    "Bullets",
    "Clues",
    "Culprit",
    "Document",
    "ExperimentPostMortem",
    "Figure",
    "FirstAlert",
    "HangDiagnosis",
    "Impact",
    "IncidentPostMortem",
    "JobProgress",
    "KeyValues",
    "LossCheck",
    "LossMismatch",
    "Paragraph",
    "PlotRef",
    "RankDump",
    "RankExit",
    "RankHang",
    "RankProgress",
    "ReportFiles",
    "Restart",
    "RestartFailure",
    "Section",
    "StepDone",
    "Table",
    "TimelineEvent",
    "WorkerStart",
    "compare_dumps",
    "compare_losses",
    "culprit_from_dumps",
    "elapsed",
    "experiment_document",
    "failed_ranks",
    "find_culprit",
    "format_clock",
    "incident_document",
    "incident_dumps",
    "measure_impact",
    "port_conflicts",
    "render_html",
    "render_markdown",
    "restart_after",
    "restart_failure",
    "steps_lost",
    "write_atomic",
    "write_report",
]
