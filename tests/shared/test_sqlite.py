"""The one SQLite helper: connection settings, transactions, versioned migrations."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from stormwatch.errors import SchemaTooNewError
from stormwatch.sqlite import (
    Migration,
    Schema,
    connect,
    migrate,
    open_database,
    statements,
    transaction,
    user_version,
)

NOTES = Schema(
    "notes database",
    (
        Migration(1, "notes", "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL)"),
        Migration(
            2,
            "authors; every note gets one",
            "CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT NOT NULL);"
            "INSERT INTO authors (id, name) VALUES (1, 'unknown');"
            "ALTER TABLE notes ADD COLUMN author INTEGER NOT NULL DEFAULT 1",
        ),
    ),
    fix="or pass another --notes file",
)


def test_connection_is_wal_full_sync_with_foreign_keys_and_rows(tmp_path: Path) -> None:
    conn = connect(tmp_path / "a.sqlite")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.isolation_level is None  # transactions are explicit
        assert isinstance(conn.execute("SELECT 1 AS one").fetchone(), sqlite3.Row)
    finally:
        conn.close()


def test_a_new_database_runs_every_step_and_reopens_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    conn = open_database(path, NOTES)
    conn.execute("INSERT INTO notes (text) VALUES ('hello')")
    conn.close()
    conn = open_database(path, NOTES)
    try:
        assert user_version(conn) == 2
        assert [tuple(r) for r in conn.execute("SELECT text, author FROM notes")] == [("hello", 1)]
    finally:
        conn.close()


def test_an_older_database_migrates_in_place_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    old = Schema("notes database", NOTES.migrations[:1])
    conn = open_database(path, old)
    conn.execute("INSERT INTO notes (text) VALUES ('from version 1')")
    conn.close()
    conn = connect(path)
    try:
        assert migrate(conn, NOTES, path=path) == 1
        assert user_version(conn) == 2
        row = conn.execute("SELECT notes.text, authors.name FROM notes JOIN authors").fetchone()
        assert tuple(row) == ("from version 1", "unknown")
    finally:
        conn.close()


def test_a_newer_database_is_refused_naming_the_file_and_the_fix_untouched(
    tmp_path: Path,
) -> None:
    path = tmp_path / "notes.sqlite"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 7")
    raw.close()
    before = path.read_bytes()
    with pytest.raises(SchemaTooNewError) as raised:
        open_database(path, NOTES, wal=False)
    message = str(raised.value)
    for phrase in (str(path), "notes database schema 7", "newer stormwatch", "reads schema 2"):
        assert phrase in message, message
    assert "upgrade stormwatch, or pass another --notes file" in message
    assert (raised.value.found, raised.value.known, raised.value.path) == (7, 2, path)
    assert path.read_bytes() == before


def test_a_failing_step_rolls_every_step_back(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    broken = Schema(
        "notes database",
        (NOTES.migrations[0], Migration(2, "typo", "CREATE TABLE authors (id INTEGER PRIMAR")),
    )
    conn = connect(path)
    try:
        with pytest.raises(sqlite3.OperationalError):
            migrate(conn, broken, path=path)
        assert user_version(conn) == 0
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []
    finally:
        conn.close()


def test_a_step_that_rebuilds_a_referenced_table_runs_with_foreign_keys_checked(
    tmp_path: Path,
) -> None:
    def rebuild(conn: sqlite3.Connection) -> None:
        for sql in statements(
            "CREATE TABLE notes_new (id INTEGER PRIMARY KEY, body TEXT NOT NULL);"
            "INSERT INTO notes_new SELECT id, text FROM notes;"
            "DROP TABLE notes;"
            "ALTER TABLE notes_new RENAME TO notes"
        ):
            conn.execute(sql)

    schema = Schema(
        "notes database",
        (
            Migration(
                1,
                "notes and tags",
                "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL);"
                "CREATE TABLE tags (note INTEGER NOT NULL REFERENCES notes (id), tag TEXT);"
                "INSERT INTO notes VALUES (1, 'x'); INSERT INTO tags VALUES (1, 'red')",
            ),
            Migration(2, "rename a column", upgrade=rebuild, rebuilds_tables=True),
        ),
    )
    conn = open_database(tmp_path / "notes.sqlite", schema)
    try:
        row = conn.execute("SELECT body, tag FROM notes JOIN tags ON note = notes.id").fetchone()
        assert tuple(row) == ("x", "red")
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1  # back on
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO tags VALUES (9, 'dangling')")
    finally:
        conn.close()


def test_statements_keep_trigger_bodies_whole() -> None:
    script = """
    CREATE TABLE t (x);
    CREATE TRIGGER t_no_delete BEFORE DELETE ON t
    BEGIN SELECT RAISE(ABORT, 'no; never'); END;
    INSERT INTO t VALUES ('a;b');
    """
    found = statements(script)
    assert len(found) == 3
    assert found[1].startswith("CREATE TRIGGER") and found[1].endswith("END;")
    assert found[2] == "INSERT INTO t VALUES ('a;b');"
    with pytest.raises(ValueError, match="incomplete"):
        statements("CREATE TABLE t (x); CREATE TRIGGER x BEFORE DELETE ON t BEGIN SELECT 1;")


def test_transaction_commits_or_rolls_back_and_readonly_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    conn = open_database(path, NOTES)
    with transaction(conn):
        conn.execute("INSERT INTO notes (text) VALUES ('kept')")
    with pytest.raises(RuntimeError), transaction(conn):
        conn.execute("INSERT INTO notes (text) VALUES ('dropped')")
        raise RuntimeError("boom")
    conn.close()
    reader = connect(path, readonly=True)
    try:
        assert [r[0] for r in reader.execute("SELECT text FROM notes")] == ["kept"]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.execute("INSERT INTO notes (text) VALUES ('no')")
    finally:
        reader.close()


def test_two_processes_worth_of_writers_wait_for_each_other(tmp_path: Path) -> None:
    """Immediate transactions on two connections serialise instead of failing."""
    path = tmp_path / "notes.sqlite"
    open_database(path, NOTES).close()
    errors: list[BaseException] = []

    def write(n: int) -> None:
        conn = connect(path)
        try:
            for i in range(20):
                with transaction(conn):
                    count = conn.execute("SELECT count(*) FROM notes").fetchone()[0]
                    conn.execute("INSERT INTO notes (text) VALUES (?)", (f"{n}-{i}-{count}",))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    conn = connect(path)
    try:
        assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 60
    finally:
        conn.close()


def test_steps_must_be_numbered_in_order() -> None:
    with pytest.raises(ValueError, match=r"numbered 1\.\.N"):
        Schema("x", (Migration(2, "skip one"),))
