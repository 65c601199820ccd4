"""The controller's fault ledger opens a database written before it was versioned, and
refuses one written by a newer stormwatch, naming the file and the fix."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from stormwatch.chaos import Ledger, LedgerError

# The ledger as the controller wrote it before its layout had a version (user_version 0),
# with one open fault (the JSON of a kill_rank spec and its target, as stored then).
_UNVERSIONED = """
CREATE TABLE faults (
    id              TEXT PRIMARY KEY,
    experiment_id   TEXT NOT NULL,
    kind            TEXT NOT NULL,
    spec            TEXT NOT NULL,
    target          TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'injected', 'reverted')),
    recorded_at     REAL NOT NULL,
    expires_at      REAL NOT NULL,
    injected_at     REAL,
    target_pid      INTEGER,
    reverted_at     REAL,
    revert_reason   TEXT,
    revert_detail   TEXT,
    controller_pid  INTEGER NOT NULL,
    controller_started_at REAL NOT NULL,
    last_error      TEXT
);
CREATE INDEX faults_experiment ON faults (experiment_id);
INSERT INTO faults VALUES ('exp.kill', 'exp', 'kill_rank',
    '{"kind":"kill_rank","rank":1,"signal":"SIGKILL","ttl_seconds":60.0}',
    '{"job":"j","rank":1,"node":"node0","agent_url":"http://127.0.0.1:9",'
    || '"token_file":"/nonexistent","pid":null,"pid_create_time":null,"requests":[]}',
    'injected', 100.0, 160.0, 101.0, 4242, NULL, NULL, NULL, 1, 1.0, NULL);
"""


def _make(path: Path, script: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    try:
        db.executescript(script)
    finally:
        db.close()


def _version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def test_a_ledger_written_before_versioning_opens_and_migrates(tmp_path: Path) -> None:
    path = tmp_path / "chaos" / "ledger.sqlite3"
    _make(path, _UNVERSIONED)
    ledger = Ledger(path, create=False)
    [entry] = ledger.open_faults()
    assert (entry.id, entry.kind, entry.state, entry.target_pid, entry.target.node) == (
        "exp.kill",
        "kill_rank",
        "injected",
        4242,
        "node0",
    )
    assert ledger.unreadable == {}
    assert _version(path) == 1
    assert ledger.mark_reverted("exp.kill", reason="request") is True
    assert Ledger(path).open_faults() == []


def test_a_ledger_from_a_newer_stormwatch_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "chaos" / "ledger.sqlite3"
    _make(path, _UNVERSIONED + "PRAGMA user_version = 9;")
    before = path.read_bytes()
    with pytest.raises(LedgerError) as raised:
        Ledger(path, create=False)
    message = str(raised.value)
    for phrase in (str(path), "fault ledger schema 9", "newer stormwatch", "--run-dir"):
        assert phrase in message, message
    assert path.read_bytes() == before
