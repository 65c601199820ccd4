"""The agent's fault ledger opens the database of the current layout unchanged and refuses
one written by a newer stormwatch, naming the file and the fix."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from stormwatch.agent.errors import LedgerError
from stormwatch.agent.faults.ledger import FaultLedger

# The ledger as the agent of schema 1 wrote it, with one applied fault.
_V1 = """
CREATE TABLE faults (
    id            TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,
    node          TEXT NOT NULL,
    spec          TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('injecting', 'applied', 'reverted', 'failed')),
    created_at    REAL NOT NULL,
    applied_at    REAL,
    expires_at    REAL NOT NULL,
    reverted_at   REAL,
    revert_reason TEXT,
    target_pid    INTEGER,
    details       TEXT NOT NULL DEFAULT '{}',
    error         TEXT
);
CREATE INDEX faults_state_expires ON faults (state, expires_at);
INSERT INTO faults VALUES ('f1', 'kill_rank', 'node0',
    '{"job": "j", "rank": 1, "signal": "SIGKILL"}', 'applied', 100.0, 100.5, 160.0, NULL, NULL,
    4242, '{"signal": "SIGKILL"}', NULL);
PRAGMA user_version = 1;
"""


def _make(path: Path, script: str) -> None:
    db = sqlite3.connect(path)
    try:
        db.executescript(script)
    finally:
        db.close()


def test_a_ledger_of_the_current_layout_opens_with_its_faults(tmp_path: Path) -> None:
    path = tmp_path / "faults.sqlite3"
    _make(path, _V1)
    ledger = FaultLedger(path)
    try:
        [record] = ledger.active()
        assert (record.id, record.state.value, record.target_pid) == ("f1", "applied", 4242)
        assert record.spec == {"job": "j", "rank": 1, "signal": "SIGKILL"}
        assert record.details == {"signal": "SIGKILL"}
        ledger.mark_reverted("f1", at=170.0, reason="ttl")
        assert ledger.active() == []
    finally:
        ledger.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


def test_a_ledger_from_a_newer_stormwatch_is_refused_naming_file_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "faults.sqlite3"
    _make(path, _V1.replace("user_version = 1", "user_version = 2"))
    with pytest.raises(LedgerError) as raised:
        FaultLedger(path)
    message = str(raised.value)
    for phrase in (str(path), "fault ledger schema 2", "newer stormwatch", "--state-dir"):
        assert phrase in message, message
