"""The responder refuses a database of another schema version, naming the file and the fix."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stormwatch.alerts import StoreError
from stormwatch.alerts.responder.store import SCHEMA_VERSION, Store

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

OTHER_DATABASES = {
    "schema 1 (one incident per alert)": (
        _V1,
        ["schema 1 is older", f"schema {SCHEMA_VERSION}", "move it away", "--db"],
    ),
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
