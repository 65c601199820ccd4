"""Build and write one incident post-mortem (see :mod:`stormwatch.alerts.postmortem`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from stormwatch.alerts.postmortem import PostMortemFiles, UnknownIncident, incident_folder
from stormwatch.alerts.postmortem.build import build
from stormwatch.alerts.postmortem.render import render_html, render_markdown, write_plots
from stormwatch.alerts.postmortem.sources import gather
from stormwatch.alerts.responder.audit import AuditLog
from stormwatch.alerts.responder.store import Store


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write(
    *,
    db_path: Path,
    incident_id: int,
    postmortem_dir: Path,
    lab_run_dir: Path | None = None,
    prometheus_url: str | None = None,
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

    Raises:
        UnknownIncident: no incident ``incident_id`` (the message lists the known range).
        StoreError: the database cannot be read.
    """
    store = Store(db_path)
    try:
        incident = store.incident(incident_id)
        if incident is None:
            known = store.incidents(limit=1_000_000)
            span = f"{known[0].id}..{known[-1].id}" if known else "none yet"
            raise UnknownIncident(
                f"INCIDENT: no incident {incident_id} in {db_path} (incidents: {span}); "
                "list them with `stormwatch alerts incidents`"
            )
        actions = [a for a in store.actions(limit=1_000_000) if a.incident_id == incident_id]
    finally:
        store.close()
    audit_log = AuditLog(db_path)
    try:
        audit = [e for e in audit_log.entries(limit=1_000_000) if e.incident_id == incident_id]
    finally:
        audit_log.close()
    now = clock()
    inputs = gather(
        incident,
        actions,
        audit,
        now=now,
        lab_run_dir=lab_run_dir,
        prometheus_url=prometheus_url,
    )
    pm = build(inputs, now=now)
    folder = incident_folder(postmortem_dir, incident_id)
    folder.mkdir(parents=True, exist_ok=True)
    pm.plots = write_plots(pm, inputs, folder)
    files = PostMortemFiles(
        folder=folder,
        markdown=folder / "postmortem.md",
        html=folder / "postmortem.html",
        json=folder / "postmortem.json",
        postmortem=pm,
    )
    _write_atomic(files.json, pm.model_dump_json(indent=2))
    _write_atomic(files.markdown, render_markdown(pm))
    _write_atomic(files.html, render_html(pm, folder))
    return files


__all__ = ["write"]
