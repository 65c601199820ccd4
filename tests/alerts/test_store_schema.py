"""The responder's database layout is versioned: an older database migrates in place, a newer
one or another program's file is refused naming the file and the fix, and left untouched."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stormwatch.alerts import StoreError
from stormwatch.alerts.responder.schema import SCHEMA_VERSION
from stormwatch.alerts.responder.store import Store

# Schema 1 (one incident per alert occurrence), as the first responder wrote it.
_V1 = """
CREATE TABLE incidents (
    id INTEGER PRIMARY KEY, alertname TEXT NOT NULL, fingerprint TEXT NOT NULL,
    starts_at_key TEXT NOT NULL, status TEXT NOT NULL, labels TEXT NOT NULL,
    annotations TEXT NOT NULL, group_key TEXT NOT NULL, starts_at REAL NOT NULL,
    ends_at REAL, opened_at REAL NOT NULL, closed_at REAL, UNIQUE (fingerprint, starts_at_key)
);
PRAGMA user_version = 1;
"""
# The rest of the first responder's tables, and a history: two alerts of one group open
# (one incident each, as schema 1 kept them), one closed incident of another group.
_V1_REST = """
CREATE TABLE notifications (
    id INTEGER PRIMARY KEY, received_at REAL NOT NULL, group_key TEXT NOT NULL,
    status TEXT NOT NULL, receiver TEXT NOT NULL, alerts INTEGER NOT NULL,
    new_alerts INTEGER NOT NULL
);
CREATE TABLE deliveries (
    group_key TEXT NOT NULL, fingerprint TEXT NOT NULL, starts_at_key TEXT NOT NULL,
    status TEXT NOT NULL, notification_id INTEGER NOT NULL REFERENCES notifications (id),
    PRIMARY KEY (group_key, fingerprint, starts_at_key, status)
) WITHOUT ROWID;
CREATE TABLE actions (
    id INTEGER PRIMARY KEY, incident_id INTEGER NOT NULL REFERENCES incidents (id),
    kind TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'skipped')),
    created_at REAL NOT NULL, started_at REAL, finished_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0, detail TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}', UNIQUE (incident_id, kind)
);
INSERT INTO notifications VALUES (1, 100.0, 'g1', 'firing', 'r', 2, 2);
INSERT INTO notifications VALUES (2, 50.0, 'g2', 'resolved', 'r', 1, 1);
INSERT INTO incidents VALUES (1, 'StormwatchRankStalled', 'aaa', '1970-01-01T00:01:30+00:00',
    'open', '{"job": "train", "rank": "1"}', '{}', 'g1', 90.0, NULL, 100.0, NULL);
INSERT INTO incidents VALUES (2, 'StormwatchRankStalled', 'bbb', '1970-01-01T00:01:35+00:00',
    'open', '{"job": "train", "rank": "2"}', '{}', 'g1', 95.0, NULL, 100.0, NULL);
INSERT INTO incidents VALUES (3, 'StormwatchNodeDown', 'ccc', '1970-01-01T00:00:10+00:00',
    'closed', '{"node": "n1"}', '{"summary": "down"}', 'g2', 10.0, 40.0, 20.0, 50.0);
INSERT INTO actions VALUES (1, 1, 'confirm_restart', 'succeeded', 100.0, 100.5, 130.0, 1, 'ok',
    '{"ranks_progressed": ["0", "1"]}');
INSERT INTO actions VALUES (2, 2, 'confirm_restart', 'pending', 100.0, NULL, NULL, 0, '', '{}');
"""

OTHER_DATABASES = {
    "a newer schema": (
        "CREATE TABLE incidents (id INTEGER PRIMARY KEY);"
        f" PRAGMA user_version = {SCHEMA_VERSION + 1};",
        [f"schema {SCHEMA_VERSION + 1} was written by a newer stormwatch", "--db"],
    ),
    "someone else's database": (
        "CREATE TABLE actions (x TEXT);",
        ["not a stormwatch responder database", "--db"],
    ),
    "another program's versioned database (e.g. the agent's fault ledger)": (
        "CREATE TABLE faults (id TEXT PRIMARY KEY); PRAGMA user_version = 1;",
        ["not a stormwatch responder database", "leave it alone", "--db"],
    ),
}


def _make(path: Path, script: str) -> None:
    db = sqlite3.connect(path)
    try:
        db.executescript(script)
    finally:
        db.close()


@pytest.mark.parametrize("case", list(OTHER_DATABASES))
def test_database_of_another_schema_is_refused_with_the_file_and_the_fix(
    case: str, tmp_path: Path, kit: Any, token_file: tuple[str, Path]
) -> None:
    script, phrases = OTHER_DATABASES[case]
    path = tmp_path / "responder.sqlite"
    _make(path, script)
    before = path.read_bytes()

    with pytest.raises(StoreError) as raised:
        Store(path)
    for phrase in [str(path), *phrases]:
        assert phrase in str(raised.value), (phrase, str(raised.value))

    # The command line says the same, without a traceback, and touches nothing.
    serve = [kit.stormwatch, "alerts", "serve", "--listen", "127.0.0.1:0", "--db", str(path)]
    run = subprocess.run(
        [*serve, "--token-file", str(token_file[1])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Another program's file is a wrong --db (a usage error, 2); an old or new responder
    # database is the responder's own, of another version (1).
    assert run.returncode == (2 if "not a stormwatch responder database" in phrases else 1), run
    assert str(path) in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert path.read_bytes() == before


def test_new_database_gets_the_current_schema_and_reopens(tmp_path: Path) -> None:
    path = tmp_path / "responder.sqlite"
    Store(path).close()
    Store(path).close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        db.close()


def test_schema_1_database_migrates_in_place_keeping_its_history(tmp_path: Path) -> None:
    path = tmp_path / "responder.sqlite"
    _make(path, _V1 + _V1_REST)

    store = Store(path)
    try:
        incidents = {i.id: i for i in store.incidents(limit=10)}
        actions = store.actions(limit=10)
    finally:
        store.close()

    # Each alert kept its incident (ids, times, labels), now as the incident's one member.
    assert sorted(incidents) == [1, 2, 3]
    node_down = incidents[3]
    assert (node_down.status, node_down.alertname, node_down.group_key) == (
        "closed",
        "StormwatchNodeDown",
        "g2",
    )
    assert (node_down.opened_at, node_down.closed_at, node_down.ends_at) == (20.0, 50.0, 40.0)
    [member] = node_down.members
    assert (member.fingerprint, member.status, member.starts_at, member.ends_at) == (
        "ccc",
        "resolved",
        10.0,
        40.0,
    )
    assert member.labels == {"node": "n1"} and member.annotations == {"summary": "down"}
    # Schema 2 allows one open incident per group: the earliest stays open.
    assert incidents[1].status == "open" and incidents[1].members[0].status == "firing"
    assert incidents[2].status == "closed" and incidents[2].closed_at is not None
    assert incidents[2].members[0].status == "firing"
    # Actions are untouched.
    assert [(a.id, a.incident_id, a.status, a.data) for a in actions] == [
        (1, 1, "succeeded", {"ranks_progressed": ["0", "1"]}),
        (2, 2, "pending", {}),
    ]
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        assert db.execute("SELECT count(*) FROM audit").fetchone()[0] == 0
    finally:
        db.close()


def test_a_migrated_database_keeps_deduplicating_and_grouping(tmp_path: Path, kit: Any) -> None:
    from stormwatch.alerts.responder.payload import WebhookMessage

    path = tmp_path / "responder.sqlite"
    _make(path, _V1 + _V1_REST)
    store = Store(path)
    try:
        new_alert = kit.alert(starts_at=200.0, fingerprint="ddd", rank="3")
        message = WebhookMessage.model_validate(kit.payload(new_alert, group_key="g1"))
        done = store.ingest(message, received_at=201.0, actions_for=lambda name: ())
        assert (done.opened, done.joined) == ([], [1])  # joins the group's open incident
        again = store.ingest(message, received_at=202.0, actions_for=lambda name: ())
        assert again.duplicates == 1 and again.joined == []
        [incident] = [i for i in store.incidents(limit=10) if i.id == 1]
        assert [m.fingerprint for m in incident.members] == ["aaa", "ddd"]
    finally:
        store.close()


# The database the responder of schema 2 (before the audit table joined the versioned
# layout) wrote, with its audit log: it must open unchanged and gain schema 3.
_V2_WITH_AUDIT = """
CREATE TABLE notifications (
    id INTEGER PRIMARY KEY, received_at REAL NOT NULL, group_key TEXT NOT NULL,
    status TEXT NOT NULL, receiver TEXT NOT NULL, alerts INTEGER NOT NULL,
    new_alerts INTEGER NOT NULL
);
CREATE TABLE deliveries (
    group_key TEXT NOT NULL, fingerprint TEXT NOT NULL, starts_at_key TEXT NOT NULL,
    status TEXT NOT NULL, notification_id INTEGER NOT NULL REFERENCES notifications (id),
    PRIMARY KEY (group_key, fingerprint, starts_at_key, status)
) WITHOUT ROWID;
CREATE TABLE incidents (
    id INTEGER PRIMARY KEY, group_key TEXT NOT NULL, group_labels TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'closed')), alertname TEXT NOT NULL,
    opened_at REAL NOT NULL, closed_at REAL
);
CREATE UNIQUE INDEX incidents_one_open_per_group ON incidents (group_key) WHERE status = 'open';
CREATE TABLE incident_members (
    fingerprint TEXT NOT NULL, starts_at_key TEXT NOT NULL,
    incident_id INTEGER NOT NULL REFERENCES incidents (id), alertname TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('firing', 'resolved')), labels TEXT NOT NULL,
    annotations TEXT NOT NULL, group_key TEXT NOT NULL, starts_at REAL NOT NULL, ends_at REAL,
    joined_at REAL NOT NULL, resolved_at REAL, PRIMARY KEY (fingerprint, starts_at_key)
) WITHOUT ROWID;
CREATE INDEX incident_members_by_incident ON incident_members (incident_id);
CREATE TABLE actions (
    id INTEGER PRIMARY KEY, incident_id INTEGER NOT NULL REFERENCES incidents (id),
    kind TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'skipped')),
    created_at REAL NOT NULL, started_at REAL, finished_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0, detail TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}', UNIQUE (incident_id, kind)
);
CREATE TABLE audit (
    id INTEGER PRIMARY KEY, time REAL NOT NULL, actor TEXT NOT NULL, event TEXT NOT NULL,
    action_id INTEGER, incident_id INTEGER, kind TEXT NOT NULL, job TEXT, node TEXT,
    reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_kind_time ON audit (kind, time);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
INSERT INTO incidents VALUES (1, 'g1', '{"alertname": "A"}', 'closed', 'A', 10.0, 30.0);
INSERT INTO incident_members VALUES ('f1', 'k1', 1, 'A', 'resolved', '{"rank": "0"}', '{}',
    'g1', 5.0, 25.0, 10.0, 30.0);
INSERT INTO actions VALUES (1, 1, 'restart_workers', 'succeeded', 10.0, 10.1, 12.0, 1, 'done', '{}');
INSERT INTO audit VALUES (1, 10.1, 'responder', 'started', 1, 1, 'restart_workers', 'train',
    NULL, 'A');
PRAGMA user_version = 2;
"""


def test_schema_2_database_opens_unchanged_and_readonly_reads_it_as_it_is(tmp_path: Path) -> None:
    from stormwatch.alerts.responder.audit import AuditLog

    path = tmp_path / "responder.sqlite"
    _make(path, _V2_WITH_AUDIT)
    before = path.read_bytes()
    reader = Store.open_readonly(path)  # reads schema 2 as it is: nothing written
    try:
        [incident] = reader.incidents(limit=10)
    finally:
        reader.close()
    assert path.read_bytes() == before
    assert (incident.id, incident.group_labels, incident.members[0].ends_at) == (
        1,
        {"alertname": "A"},
        25.0,
    )

    Store(path).close()
    audit = AuditLog(path)
    try:
        [entry] = audit.entries()
        assert (entry.id, entry.kind, entry.job) == (1, "restart_workers", "train")
    finally:
        audit.close()
    store = Store(path)
    try:
        assert [i.model_dump() for i in store.incidents(limit=10)] == [incident.model_dump()]
        assert [a.detail for a in store.actions(limit=10)] == ["done"]
    finally:
        store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        db.close()


def test_reading_a_schema_1_database_offline_says_the_responder_migrates_it(
    tmp_path: Path, kit: Any
) -> None:
    path = tmp_path / "responder.sqlite"
    _make(path, _V1 + _V1_REST)
    before = path.read_bytes()
    with pytest.raises(StoreError) as raised:
        Store.open_readonly(path)
    for phrase in (str(path), "schema 1 is older", "migrated in place", "--db"):
        assert phrase in str(raised.value), (phrase, str(raised.value))
    run = subprocess.run(
        [kit.stormwatch, "alerts", "incidents", "--db", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr, run
    assert path.read_bytes() == before
