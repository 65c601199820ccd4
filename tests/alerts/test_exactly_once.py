"""Exactly once across a crash: a real responder SIGKILLed between an action's writes.

The responder kills itself at a test-only crash point (``STORMWATCH_RESPONDER_CRASH_AT``,
:mod:`stormwatch.alerts.responder.crashpoints`): after an action's ``started`` entry, or
after the action ran and before its outcome and status are stored. Started again (without
the variable) on the same database, it must leave every action audited once per event and
run at most once: a read-only kind is resumed once, a remedial kind is never run again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from stormwatch.alerts.responder.crashpoints import CRASH_AT_ENV

FINAL = {"succeeded", "failed", "skipped"}


def _fire(kit: Any, responder: Any, alertname: str) -> None:
    alert = kit.alert(starts_at=time.time() - 1, alertname=alertname, job="train")
    alert["labels"]["node"] = "node0"
    assert responder.post(kit.payload(alert)).status == 200


def _crash_then_restart(responder: Any) -> None:
    """Wait for the responder's SIGKILL at its crash point; start it again without one."""
    assert responder.proc is not None
    assert responder.proc.wait(timeout=30) == -9, responder.log.read_text()
    responder.env = {}
    responder.restart()


def _final_action(kit: Any, responder: Any) -> dict[str, Any]:
    [action] = kit.wait_for(
        lambda: [a for a in responder.get("actions") if a["status"] in FINAL], 30, "final state"
    )
    return dict(action)


def _events(responder: Any, action_id: int) -> list[str]:
    return [e["event"] for e in responder.get("audit") if e["action_id"] == action_id]


def _mirrored_ids(responder: Any) -> list[int]:
    path = Path(f"{responder.db}.audit.jsonl")
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize("point", ["started", "outcome"])
def test_read_only_action_killed_mid_way_is_audited_once_and_resumed_once(
    start_responder: Any, kit: Any, tmp_path: Path, point: str
) -> None:
    policy = tmp_path / "policy.yml"
    policy.write_text("rules: [{alertname: StormwatchBurst, actions: [notify_only]}]")
    responder = start_responder("--policy", str(policy), env={CRASH_AT_ENV: f"{point}:notify_only"})
    _fire(kit, responder, "StormwatchBurst")
    _crash_then_restart(responder)

    action = _final_action(kit, responder)
    assert (action["status"], action["attempts"]) == ("succeeded", 2)
    assert _events(responder, action["id"]) == ["started", "resumed", "succeeded"]
    # The JSONL mirror holds every entry of the table once, in order (the kill came
    # before the mirror had the last ones: the restart appended them).
    assert _mirrored_ids(responder) == [e["id"] for e in responder.get("audit")]


@pytest.mark.parametrize(("point", "terms"), [("started", 0), ("outcome", 2)])
def test_restart_killed_mid_way_is_audited_failed_once_and_never_run_again(
    start_responder: Any,
    fake_job: Any,
    kit: Any,
    tmp_path: Path,
    lab: Path,
    point: str,
    terms: int,
) -> None:
    job = fake_job("train", lab / "nodes" / "node0" / "metrics")
    policy = tmp_path / "policy.yml"
    policy.write_text("rules: [{alertname: StormwatchRankCrashLoop, actions: [restart_workers]}]")
    responder = start_responder(
        "--policy",
        str(policy),
        "--lab-run-dir",
        str(lab),
        env={CRASH_AT_ENV: f"{point}:restart_workers"},
    )
    _fire(kit, responder, "StormwatchRankCrashLoop")
    _crash_then_restart(responder)

    action = _final_action(kit, responder)
    assert _events(responder, action["id"]) == ["started", "failed"]
    assert action["status"] == "failed"
    assert action["detail"] == "interrupted by a responder restart while running; not retried"
    time.sleep(1)  # a second run would have signalled the workers by now
    assert job.terms("worker") == terms  # 0: never ran; 2: ran once (one TERM per worker)
    assert _events(responder, action["id"]) == ["started", "failed"]


# -- the database's part, in process ---------------------------------------------------


def _entry(event: str, action_id: int = 1) -> Any:
    from stormwatch.alerts.responder.audit import AuditEntry

    return AuditEntry(
        time=time.time(), actor="responder", event=event, action_id=action_id, kind="notify_only"
    )


def test_the_database_refuses_a_second_audit_entry_of_one_event_for_one_action(
    tmp_path: Path,
) -> None:
    from stormwatch.alerts import StoreError
    from stormwatch.alerts.responder.audit import AuditLog

    audit = AuditLog(tmp_path / "responder.sqlite")
    try:
        audit.record(_entry("started"))
        with pytest.raises(StoreError, match="has this event of this action already"):
            audit.record(_entry("started"))
        assert audit.record(_entry("started"), once=True) is None
        audit.record(_entry("resumed"))
        audit.record(_entry("resumed"))  # each restart may resume a read-only action
        audit.record(_entry("started", action_id=2))
        assert [(e.action_id, e.event) for e in audit.entries()] == [
            (1, "started"),
            (1, "resumed"),
            (1, "resumed"),
            (2, "started"),
        ]
    finally:
        audit.close()


def _schema_3_database(path: Path) -> None:
    """A responder database as the responder before exactly-once wrote it: action 1
    (notify_only) left ``running`` after its ``started`` and ``succeeded`` entries, action 2
    (restart_workers) ``running`` after ``started``, and one entry written twice."""
    import sqlite3

    from stormwatch.alerts.responder.schema import SCHEMA
    from stormwatch.sqlite import Schema, migrate

    db = sqlite3.connect(path, isolation_level=None)
    try:
        migrate(db, Schema(SCHEMA.name, SCHEMA.migrations[:3]), path=path)
        db.executescript(
            """
            INSERT INTO incidents VALUES (1, 'g', '{}', 'open', 'StormwatchBurst', 10.0, NULL);
            INSERT INTO incident_members VALUES ('f', 's', 1, 'StormwatchBurst', 'firing',
                '{"job": "train"}', '{}', 'g', 9.0, NULL, 10.0, NULL);
            INSERT INTO actions VALUES (1, 1, 'notify_only', 'running', 10.0, 10.1, NULL, 1,
                '', '{}');
            INSERT INTO actions VALUES (2, 1, 'restart_workers', 'running', 10.0, 10.1, NULL,
                1, '', '{}');
            INSERT INTO audit VALUES (1, 10.2, 'responder', 'started', 1, 1, 'notify_only',
                'train', NULL, 'alert StormwatchBurst');
            INSERT INTO audit VALUES (2, 10.3, 'responder', 'succeeded', 1, 1, 'notify_only',
                'train', NULL, 'notified: StormwatchBurst');
            INSERT INTO audit VALUES (3, 10.4, 'responder', 'succeeded', 1, 1, 'notify_only',
                'train', NULL, 'notified: StormwatchBurst');
            INSERT INTO audit VALUES (4, 10.5, 'responder', 'started', 2, 1, 'restart_workers',
                'train', NULL, 'alert StormwatchBurst');
            """
        )
    finally:
        db.close()


def test_actions_an_older_responder_left_running_are_finished_from_their_audit_once(
    tmp_path: Path,
) -> None:
    from stormwatch.alerts.responder.audit import AuditEntry, AuditLog
    from stormwatch.alerts.responder.store import Store

    path = tmp_path / "responder.sqlite"
    _schema_3_database(path)
    store = Store(path)  # migrates: the old duplicate stays, new ones are refused

    def entry(event: Any, kind: str, action_id: int, incident: Any, reason: str) -> AuditEntry:
        return AuditEntry(time=20.0, actor="responder", event=event, action_id=action_id,
                          incident_id=incident.id, kind=kind, job="train", reason=reason)  # fmt: skip

    try:
        pending = store.recover(now=20.0, retry_safe=lambda k: k == "notify_only", entry=entry)
        assert pending == []  # the finished read-only action is not run again
        done, restart = store.actions(limit=10)
        assert (done.status, done.detail) == ("succeeded", "notified: StormwatchBurst")
        assert (restart.status, restart.detail) == (
            "failed",
            "interrupted by a responder restart while running; not retried",
        )
    finally:
        store.close()
    audit = AuditLog(path)
    try:
        assert [(e.id, e.action_id, e.event) for e in audit.entries()] == [
            (1, 1, "started"),
            (2, 1, "succeeded"),
            (3, 1, "succeeded"),
            (4, 2, "started"),
            (5, 2, "failed"),
        ]
    finally:
        audit.close()


def test_the_jsonl_mirror_catches_up_once_after_a_kill_mid_line(tmp_path: Path) -> None:
    import sqlite3

    from stormwatch.alerts.responder.audit import AuditLog

    path, jsonl = tmp_path / "responder.sqlite", tmp_path / "audit.jsonl"
    audit = AuditLog(path, jsonl)
    audit.record(_entry("started"))
    audit.record(_entry("succeeded"))
    audit.close()
    # Killed mid-append, after a third entry was committed by the store's transaction.
    with jsonl.open("a") as out:
        out.write('{"id": 3, "time": 1')
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(
        "INSERT INTO audit (time, actor, event, action_id, kind) VALUES (1, 'r', 'started', 2, 'k')"
    )
    db.close()
    AuditLog(path, jsonl).close()
    assert [json.loads(line)["id"] for line in jsonl.read_text().splitlines()] == [1, 2, 3]
    AuditLog(path, jsonl).close()  # nothing left to append
    assert len(jsonl.read_text().splitlines()) == 3
