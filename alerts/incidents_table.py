"""What ``stormwatch alerts incidents`` prints: incidents and their actions as a table
(one line per incident at any terminal width), from the responder or its database."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from stormwatch.alerts.errors import NotAResponderDatabase
from stormwatch.alerts.responder.store import Store
from stormwatch.contracts.labels import TRAINING_JOB_LABEL
from stormwatch.contracts.responder import ActionRecord, IncidentRecord
from stormwatch.tables import Col, one_line_table, short_age

#: Rows ``alerts incidents --db`` reads (the latest ones), like the responder's list API.
LIST_LIMIT = 1000
#: Below this many columns the incidents table leaves out job and closed (one line a row).
WIDE_COLUMNS = 120


def _time(value: float | None) -> str:
    if value is None:
        return "-"
    return dt.datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")


def read_store(db_path: Path) -> tuple[list[IncidentRecord], list[ActionRecord]]:
    """Incidents and actions from the responder's database, opened read-only.

    Raises:
        NotAResponderDatabase: missing, a folder, or not a responder database (exit 2).
    """
    try:
        store = Store.open_readonly(db_path)
    except NotAResponderDatabase as exc:
        raise NotAResponderDatabase(f"--db: {exc}") from exc
    try:
        # The same window as the responder's GET /v1/incidents and /v1/actions.
        return store.incidents(limit=LIST_LIMIT), store.actions(limit=LIST_LIMIT)
    finally:
        store.close()


def incidents_table(
    incidents: list[IncidentRecord], actions: list[ActionRecord], source: str, width: int
) -> Table:
    """The incidents as a rich table, one line per incident at any ``width`` (columns)."""
    wide = width >= WIDE_COLUMNS
    by_incident: dict[int, list[ActionRecord]] = {}
    for action in actions:
        by_incident.setdefault(action.incident_id, []).append(action)
    columns = [Col(header="id"), Col(header="status"), Col(header="alert", flex=True)]
    if wide:
        columns.append(Col(header="job", flex=True))
    columns += [Col(header="first rank"), Col(header="alerts")]
    if wide:
        columns += [Col(header="started"), Col(header="closed")]
    else:
        columns.append(Col(header="age"))
    columns.append(Col(header="actions", flex=True, min_width=12))
    now = time.time()
    rows = []
    for incident in incidents:
        first_rank = incident.first_alert.labels.get("rank", "-")
        if incident.first_alert_tied:
            first_rank += " (tied)"
        acts = "; ".join(
            f"{a.kind}: {a.status}" + (f" ({a.detail})" if a.detail else "")
            for a in by_incident.get(incident.id, [])
        )
        alert = incident.alertname
        if not wide:  # every shipped alert starts with it; the rest names the failure
            alert = alert.removeprefix("Stormwatch") or alert
        cells = [
            str(incident.id),
            "[red]open[/red]" if incident.status == "open" else incident.status,
            escape(alert),
        ]
        if wide:
            cells.append(escape(incident.labels.get(TRAINING_JOB_LABEL, "-")))
        cells += [escape(first_rank), str(len(incident.members))]
        if wide:
            cells += [_time(incident.starts_at), _time(incident.closed_at)]
        else:
            cells.append(short_age(now - incident.starts_at))
        cells.append(escape(acts) or "-")
        rows.append(cells)
    where = "at" if source.startswith("http") else "in"
    return one_line_table(columns, rows, width=width, title=f"Incidents {where} {source}")


__all__ = ["LIST_LIMIT", "WIDE_COLUMNS", "incidents_table", "read_store"]
