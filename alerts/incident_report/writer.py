"""Build and write one incident post-mortem (see :mod:`stormwatch.alerts.incident_report`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from stormwatch.alerts.errors import UnknownIncident
from stormwatch.alerts.incident_report import incident_folder
from stormwatch.alerts.incident_report.background import PostMortemFiles
from stormwatch.alerts.incident_report.build import build
from stormwatch.alerts.incident_report.panels import write_plots
from stormwatch.alerts.incident_report.sources import gather
from stormwatch.alerts.responder.audit import AuditEntry, AuditLog
from stormwatch.alerts.responder.store import Store
from stormwatch.clients.http import HttpOptions
from stormwatch.contracts.responder import ActionRecord, IncidentRecord
from stormwatch.platforms.slurm import SlurmCommands
from stormwatch.postmortem import incident_document, write_report
from stormwatch.postmortem.files import HTML

#: Rows read from the responder's tables (every row: an incident's actions can be old).
ALL_ROWS = 1_000_000


def _records(
    db_path: Path, incident_id: int
) -> tuple[IncidentRecord, list[ActionRecord], list[AuditEntry]]:
    """The incident, its actions and its audit entries from the responder's database.

    Raises:
        UnknownIncident: no incident ``incident_id`` (the message lists the known range).
    """
    store = Store(db_path)
    try:
        incident = store.incident(incident_id)
        if incident is None:
            known = store.incidents(limit=ALL_ROWS)
            span = f"{known[0].id}..{known[-1].id}" if known else "none yet"
            raise UnknownIncident(
                f"INCIDENT: no incident {incident_id} in {db_path} (incidents: {span}); "
                "list them with `stormwatch alerts incidents`"
            )
        actions = [a for a in store.actions(limit=ALL_ROWS) if a.incident_id == incident_id]
    finally:
        store.close()
    audit_log = AuditLog(db_path)
    try:
        audit = [e for e in audit_log.entries(limit=ALL_ROWS) if e.incident_id == incident_id]
    finally:
        audit_log.close()
    return incident, actions, audit


def write(
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

    Args:
        db_path: the responder's SQLite database (read; the audit table too).
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
    incident, actions, audit = _records(db_path, incident_id)
    now = clock()
    inputs = gather(
        incident,
        actions,
        audit,
        now=now,
        lab_run_dir=lab_run_dir,
        prometheus_url=prometheus_url,
        prometheus_http=prometheus_http,
        slurm=slurm,
    )
    pm = build(inputs, now=now)
    folder = incident_folder(postmortem_dir, incident_id)
    folder.mkdir(parents=True, exist_ok=True)
    pm.plots = write_plots(pm, inputs, folder)
    files = write_report(folder, pm, incident_document(pm), html=True)
    return PostMortemFiles(
        folder=folder, markdown=files.markdown, html=folder / HTML, json=files.json, postmortem=pm
    )


__all__ = ["write"]
