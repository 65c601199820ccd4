"""The incident source of the post-mortem engine: written when an incident resolves,
re-rendered on demand.

``<postmortem-dir>/incident-<id>/`` holds ``postmortem.md``, ``postmortem.html``
(self-contained: plots inlined), ``postmortem.json``
(:class:`stormwatch.postmortem.IncidentPostMortem`) and the plots as PNG files. The
responder writes it in the background when an incident closes (every member alert
resolved; :class:`PostMortemWriter`); ``stormwatch alerts postmortem INCIDENT`` writes it
again from the same sources (the responder's database and audit log, the lab's run
directory, Prometheus).

Modules: :mod:`.sources` (reading, each file through its writer's model) and
:mod:`.queries` (what it asks Prometheus), :mod:`.clues` (culprit evidence for the engine),
:mod:`.build` (onset, times, impact, culprit), :mod:`.timeline_rows` (the timeline),
:mod:`.panels` (figures), :mod:`.writer` (files), :mod:`.background` (the responder's
writer), :mod:`.cli`. Times, impact, culprit, layout and rendering are the engine's
(:mod:`stormwatch.postmortem`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from stormwatch.alerts.incident_report.background import (
    SETTLE_SECONDS,
    PostMortemFiles,
    PostMortemWriter,
)
from stormwatch.contracts.responder import incident_folder
from stormwatch.postmortem import IncidentPostMortem

if TYPE_CHECKING:
    from stormwatch.clients.http import HttpOptions
    from stormwatch.platforms.slurm import SlurmCommands


def write_incident_postmortem(
    *,
    db_path: Path,
    incident_id: int,
    postmortem_dir: Path,
    lab_run_dir: Path | None = None,
    prometheus_url: str | None = None,
    prometheus_http: HttpOptions | None = None,
    slurm: SlurmCommands | None = None,
    clock: Callable[[], float] = time.time,
) -> PostMortemFiles:
    """Build and write the post-mortem of one incident (blocking; seconds with Prometheus).

    The readers are imported on the first call, so that starting the responder does not
    load them.

    Args:
        db_path: the responder's SQLite database (incidents, actions, audit log).
        incident_id: the incident.
        postmortem_dir: parent folder of ``incident-<id>/`` (created).
        lab_run_dir: the lab's run directory (rank logs, dumps, spans, agent
            events, chaos journals), or None.
        prometheus_url: Prometheus base URL for the plots and the straggler/XID
            evidence, or None (plots from the rank logs).
        prometheus_http: how to reach it (TLS, auth: a target file's ``prometheus.http``);
            None: plain HTTP.
        slurm: the Slurm command client when the platform is ``slurm``: the job's
            transitions and the nodes' drain reasons join the timeline; None: not read.
        clock: Unix time source.

    Raises:
        UnknownIncident: no incident ``incident_id`` (the message lists the known range).
        StoreError: the database cannot be read.
    """
    from stormwatch.alerts.incident_report.writer import write

    return write(
        db_path=db_path,
        incident_id=incident_id,
        postmortem_dir=postmortem_dir,
        lab_run_dir=lab_run_dir,
        prometheus_url=prometheus_url,
        prometheus_http=prometheus_http,
        slurm=slurm,
        clock=clock,
    )


def recovery_visible(pm: IncidentPostMortem, lab_run_dir: Path | None) -> bool | None:
    """Whether the job's rank logs now show a step completed by a worker started after
    the onset; None when that cannot be known (no lab run directory, job or onset)."""
    if lab_run_dir is None or pm.job is None or pm.onset_at is None:
        return None
    from stormwatch.postmortem import restart_after
    from stormwatch.telemetry.ranklogs import job_progress, read_job_logs

    logs_dir = Path(lab_run_dir) / "jobs" / pm.job / "logs"
    if not logs_dir.is_dir():
        return None
    return restart_after(job_progress(read_job_logs(logs_dir)), pm.onset_at).first_step is not None


__all__ = [
    "SETTLE_SECONDS",
    "PostMortemFiles",
    "PostMortemWriter",
    "incident_folder",
    "recovery_visible",
    "write_incident_postmortem",
]
