"""The fault ledger: a durable SQLite record of every fault the controller injected (FC-13).

A fault is written here *before* it is sent (state ``pending``: it may or may
not have taken effect), marked ``injected`` when the target confirms, and
``reverted`` once undone. Anything not ``reverted`` is *open*: ``stormwatch
chaos revert --all`` and the next controller start revert it, and the agent or
reaper reverts it at ``expires_at``. Each call is its own short transaction on
its own connection (:func:`stormwatch.sqlite.connect`: WAL, ``synchronous=FULL``), so
several processes (controller, reaper, ``revert``) can share the file, and a committed row
survives a crash. The layout is versioned (:data:`SCHEMA`, ``PRAGMA user_version``).

Default location: ``<run-dir>/chaos/ledger.sqlite3`` (:func:`ledger_path`). A row's model,
which every reader uses, is :class:`stormwatch.contracts.fault_ledger.LedgerEntry`.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
from pydantic import TypeAdapter, ValidationError

from stormwatch.chaos.errors import LedgerError
from stormwatch.contracts.fault_ledger import FaultTarget, LedgerEntry
from stormwatch.errors import SchemaTooNewError
from stormwatch.faults import AnyExperimentFault
from stormwatch.faults.system import same_process
from stormwatch.sqlite import Migration, Schema, connect, open_database, transaction

logger = logging.getLogger(__name__)

#: Seconds a call waits for another process's lock (controller, reaper and ``chaos revert``
#: share the file; each holds it for one short statement).
BUSY_TIMEOUT_S = 30.0
_FAULT_ADAPTER: TypeAdapter[AnyExperimentFault] = TypeAdapter(AnyExperimentFault)

_FAULTS_TABLE = """
CREATE TABLE IF NOT EXISTS faults (
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
CREATE INDEX IF NOT EXISTS faults_experiment ON faults (experiment_id);
"""
#: The ledger's layout, one step per change (``PRAGMA user_version`` = steps applied). A
#: ledger written before versioning (user_version 0, same table) takes step 1 as a no-op.
SCHEMA = Schema(
    "fault ledger",
    (Migration(1, "faults table", _FAULTS_TABLE),),
    fix="or use another --run-dir",
)


def ledger_path(run_dir: Path) -> Path:
    """Where a run directory's ledger lives: ``<run-dir>/chaos/ledger.sqlite3``."""
    return Path(run_dir) / "chaos" / "ledger.sqlite3"


def controller_identity(pid: int | None = None) -> tuple[int, float]:
    """(pid, process start time) of this process or ``pid``; identifies a controller across PID reuse."""
    process = psutil.Process(pid)
    return process.pid, process.create_time()


class Ledger:
    """Durable record of injected faults (SQLite file at ``path``).

    Args:
        path: the database file; its folder is created.
        create: create the file when missing (``False``: raise :class:`LedgerError`).

    Raises:
        LedgerError: the file cannot be opened or migrated, or was written by a newer
            stormwatch (the message names the file and the fix).
    """

    def __init__(self, path: Path, *, create: bool = True) -> None:
        self.path = Path(path)
        #: id -> why, for rows that could not be read (skipped by every query; a command
        #: that reads the ledger reports them and fails, see ``stormwatch chaos revert``).
        self.unreadable: dict[str, str] = {}
        if not create and not self.path.exists():
            raise LedgerError(f"no fault ledger at {self.path}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            open_database(self.path, SCHEMA, busy_timeout=BUSY_TIMEOUT_S).close()
        except SchemaTooNewError as exc:
            raise LedgerError(str(exc)) from exc
        except (OSError, sqlite3.Error) as exc:
            raise LedgerError(f"cannot open the fault ledger {self.path}: {exc}") from exc

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = connect(self.path, busy_timeout=BUSY_TIMEOUT_S)
        try:
            yield conn
        finally:
            conn.close()

    def _write(self, sql: str, params: tuple[object, ...]) -> int:
        try:
            with self._connect() as conn, transaction(conn):
                return conn.execute(sql, params).rowcount
        except sqlite3.Error as exc:
            raise LedgerError(f"fault ledger {self.path}: {exc}") from exc

    def record(
        self,
        *,
        fault_id: str,
        experiment_id: str,
        spec: AnyExperimentFault,
        target: FaultTarget,
        expires_at: float,
        now: float | None = None,
    ) -> LedgerEntry:
        """Write a fault as ``pending`` *before* it is sent; recording the same id again is a no-op.

        Raises:
            LedgerError: the row could not be written (then the fault must not be sent).
        """
        pid, started = controller_identity()
        self._write(
            "INSERT OR IGNORE INTO faults (id, experiment_id, kind, spec, target, state, "
            "recorded_at, expires_at, controller_pid, controller_started_at) "
            "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
            (
                fault_id,
                experiment_id,
                spec.kind,
                spec.model_dump_json(),
                target.model_dump_json(),
                time.time() if now is None else now,
                expires_at,
                pid,
                started,
            ),
        )
        return self.get(fault_id)

    def retarget(self, fault_id: str, target: FaultTarget) -> LedgerEntry:
        """Change a *pending* fault's target (the previous one refused it, so nothing happened).

        Raises:
            LedgerError: the fault is not pending any more.
        """
        changed = self._write(
            "UPDATE faults SET target=? WHERE id=? AND state='pending'",
            (target.model_dump_json(), fault_id),
        )
        if not changed:
            raise LedgerError(f"fault {fault_id!r} is not pending; its target cannot change")
        return self.get(fault_id)

    def mark_injected(
        self, fault_id: str, *, injected_at: float, expires_at: float, target_pid: int | None
    ) -> LedgerEntry:
        """Confirm a pending fault took effect (no change once reverted)."""
        self._write(
            "UPDATE faults SET state='injected', injected_at=?, expires_at=?, target_pid=? "
            "WHERE id=? AND state='pending'",
            (injected_at, expires_at, target_pid, fault_id),
        )
        return self.get(fault_id)

    def mark_reverted(self, fault_id: str, *, reason: str, detail: str = "") -> bool:
        """Close a fault; returns ``False`` when it was already reverted (idempotent)."""
        changed = self._write(
            "UPDATE faults SET state='reverted', reverted_at=?, revert_reason=?, revert_detail=?, "
            "last_error=NULL WHERE id=? AND state!='reverted'",
            (time.time(), reason, detail, fault_id),
        )
        return changed > 0

    def note_error(self, fault_id: str, error: str) -> None:
        """Remember the last failed attempt to inject or revert (the fault stays open)."""
        self._write("UPDATE faults SET last_error=? WHERE id=?", (error, fault_id))

    def get(self, fault_id: str) -> LedgerEntry:
        """The entry for ``fault_id``.

        Raises:
            LedgerError: no such fault.
        """
        rows = self._select("WHERE id=?", (fault_id,))
        if not rows:
            raise LedgerError(f"fault {fault_id!r} is not in the ledger {self.path}")
        return rows[0]

    def entries(self, *, experiment_id: str | None = None) -> list[LedgerEntry]:
        """Every fault (of one experiment), oldest first."""
        if experiment_id is None:
            return self._select("", ())
        return self._select("WHERE experiment_id=?", (experiment_id,))

    def open_faults(self, *, experiment_id: str | None = None) -> list[LedgerEntry]:
        """Faults not reverted yet (of one experiment), oldest first."""
        return [e for e in self.entries(experiment_id=experiment_id) if e.open]

    def orphans(self) -> list[LedgerEntry]:
        """Open faults whose controller process is gone (crashed or killed before reverting)."""
        return [
            e
            for e in self.open_faults()
            if same_process((e.controller_pid, e.controller_started_at)) is None
        ]

    def _select(self, where: str, params: tuple[object, ...]) -> list[LedgerEntry]:
        try:
            with self._connect() as conn:
                rows = conn.execute(
                    f"SELECT * FROM faults {where} ORDER BY recorded_at, id", params
                ).fetchall()
        except sqlite3.Error as exc:
            raise LedgerError(f"fault ledger {self.path}: {exc}") from exc
        entries = []
        for row in rows:
            parsed = _entry(row)
            if isinstance(parsed, LedgerEntry):
                entries.append(parsed)
                continue
            if self.unreadable.get(str(row["id"])) is None:
                logger.warning(
                    "fault ledger %s: row %s unreadable: %s", self.path, row["id"], parsed
                )
            self.unreadable[str(row["id"])] = parsed
        return entries


def _entry(row: sqlite3.Row) -> LedgerEntry | str:
    """The row as an entry, or why it cannot be read (``column.field: message; ...``)."""
    data = dict(row)
    column = ""
    try:
        column = "spec"
        data["spec"] = _FAULT_ADAPTER.validate_json(data["spec"])
        column = "target"
        data["target"] = FaultTarget.model_validate_json(data["target"])
        column = ""
        return LedgerEntry.model_validate(data)
    except ValidationError as exc:
        return _why_unreadable(column, exc)
    except (ValueError, TypeError, KeyError) as exc:
        return f"{column or 'row'}: {exc or type(exc).__name__}"


def _why_unreadable(column: str, exc: ValidationError) -> str:
    """One problem per ``;``, ``column.field: message``, for a row that did not parse.

    A pydantic error's first line only names the model (for a fault spec, the whole
    tagged union of kinds), so the reason is taken from its ``errors()`` instead.
    """
    problems = []
    for err in exc.errors(include_url=False):
        # Tagged-union branches put the kind's tag in the location: keep field names only.
        loc = [str(p) for p in err["loc"] if not str(p).startswith(("function-", "tagged-"))]
        problems.append(f"{'.'.join([column, *loc]).strip('.') or 'row'}: {err['msg']}")
    return "; ".join(problems)


__all__ = ["Ledger", "controller_identity", "ledger_path"]
