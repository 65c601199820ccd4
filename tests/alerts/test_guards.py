"""Guards on remedial actions, approvals and the audit log: a real responder over loopback."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stormwatch.alerts.actions.base import Action, ActionOutcome
from stormwatch.alerts.actions.playbook import Playbook
from stormwatch.alerts.policy import parse_policy
from stormwatch.alerts.responder.service import Responder
from stormwatch.alerts.responder.settings import ResponderSettings
from stormwatch.contracts.responder import IncidentRecord

FINAL = {"succeeded", "failed", "skipped"}


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yml"
    path.write_text(text)
    return path


def _fire(
    kit: Any, responder: Any, n: int, *, alertname: str, job: str = "train", node: str = "node0"
) -> None:
    """Open incident ``n`` (its own group and fingerprint) for ``alertname`` on ``job``."""
    alert = kit.alert(
        starts_at=time.time() - 1, fingerprint=f"{n:016x}", alertname=alertname, job=job
    )
    alert["labels"]["node"] = node
    payload = kit.payload(alert, group_key=f'{{}}:{{alertname="{alertname}", n="{n}"}}')
    assert responder.post(payload).status == 200


def _final_actions(kit: Any, responder: Any, count: int) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        actions = responder.get("actions")
        final = [a for a in actions if a["status"] in FINAL]
        return actions if len(final) == count == len(actions) else None

    return kit.wait_for(done, 30, f"{count} finished actions")


def _all(kit: Any, responder: Any, what: str) -> list[dict[str, Any]]:
    reply = kit.request("GET", f"{responder.url}/v1/{what}?limit=100000", token=responder.token)
    assert reply.status == 200, reply
    records: list[dict[str, Any]] = reply.body[what]
    return records


def _audit(responder: Any) -> list[dict[str, Any]]:
    return responder.get("audit")


def test_dry_run_records_what_it_would_do_and_signals_nothing(
    start_responder: Any, fake_job: Any, kit: Any, tmp_path: Path, lab: Path
) -> None:
    job = fake_job("train", lab / "nodes" / "node0" / "metrics")
    policy = _policy(
        tmp_path, "rules: [{alertname: StormwatchRankCrashLoop, actions: [restart_workers]}]"
    )
    responder = start_responder("--policy", str(policy), "--lab-run-dir", str(lab), "--dry-run")
    _fire(kit, responder, 1, alertname="StormwatchRankCrashLoop")
    [action] = _final_actions(kit, responder, 1)
    assert action["status"] == "succeeded"
    assert action["detail"] == "dry-run: would restart_workers for job train"
    assert action["data"] == {"dry_run": True}
    assert job.terms("worker") == 0
    assert [e["event"] for e in _audit(responder)] == ["dry_run"]


def test_restart_budget_is_per_job(
    start_responder: Any, fake_job: Any, kit: Any, tmp_path: Path, lab: Path
) -> None:
    train = fake_job("train", lab / "nodes" / "node0" / "metrics")
    other = fake_job("other", lab / "nodes" / "node1" / "metrics")
    policy = _policy(
        tmp_path,
        "guards: {restart_budget: {max_actions: 1, window: 1h}}\n"
        "rules: [{alertname: StormwatchRankCrashLoop, actions: [restart_workers]}]",
    )
    responder = start_responder("--policy", str(policy), "--lab-run-dir", str(lab))
    _fire(kit, responder, 1, alertname="StormwatchRankCrashLoop", job="train")
    _final_actions(kit, responder, 1)
    _fire(kit, responder, 2, alertname="StormwatchRankCrashLoop", job="train")
    _fire(kit, responder, 3, alertname="StormwatchRankCrashLoop", job="other", node="node1")
    actions = _final_actions(kit, responder, 3)
    by_incident = {a["incident_id"]: a for a in actions}
    assert [by_incident[i]["status"] for i in (1, 2, 3)] == ["succeeded", "skipped", "succeeded"]
    assert by_incident[2]["detail"].startswith("restart budget exhausted: 1 restarts of job train")
    kit.wait_for(lambda: train.terms("worker") == 2 and other.terms("worker") == 2, 20, "TERMs")


def test_rate_limit_refuses_beyond_the_window_budget(
    start_responder: Any, fake_job: Any, kit: Any, tmp_path: Path, lab: Path
) -> None:
    fake_job("train", lab / "nodes" / "node0" / "metrics")
    policy = _policy(
        tmp_path,
        "guards: {rate_limit: {max_actions: 2, window: 10m}}\n"
        "rules: [{alertname: StormwatchCheckpointStale, actions: [checkpoint_now]}]",
    )
    responder = start_responder("--policy", str(policy), "--lab-run-dir", str(lab))
    for n in (1, 2, 3):
        _fire(kit, responder, n, alertname="StormwatchCheckpointStale")
        _final_actions(kit, responder, n)
    statuses = [a["status"] for a in responder.get("actions")]
    assert statuses == ["succeeded", "succeeded", "skipped"]
    assert responder.get("actions")[2]["detail"].startswith("rate limit: 2 remedial actions")
    control = lab / "nodes" / "node0" / "metrics" / "control" / "rank0.json"
    assert json.loads(control.read_text())["faults"][0]["point"] == "checkpoint_now"


def test_circuit_breaker_opens_after_consecutive_failures(
    start_responder: Any, kit: Any, tmp_path: Path, lab: Path
) -> None:
    policy = _policy(
        tmp_path,
        "guards: {circuit_breaker: {failures: 2, cooldown: 10m}}\n"
        "rules: [{alertname: StormwatchRankCrashLoop, actions: [restart_workers]}]",
    )
    responder = start_responder("--policy", str(policy), "--lab-run-dir", str(lab))
    for n in (1, 2, 3):  # job "ghost" has no workers: every restart fails
        _fire(kit, responder, n, alertname="StormwatchRankCrashLoop", job="ghost")
        _final_actions(kit, responder, n)
    actions = responder.get("actions")
    assert [a["status"] for a in actions] == ["failed", "failed", "skipped"]
    assert "no live worker of job 'ghost'" in actions[0]["detail"]
    assert actions[2]["detail"].startswith("circuit breaker open: the last 2 restart_workers")
    # The breaker's state is the audit log: it stays open across a restart.
    responder.restart()
    _fire(kit, responder, 4, alertname="StormwatchRankCrashLoop", job="ghost")
    assert _final_actions(kit, responder, 4)[3]["status"] == "skipped"


def test_destructive_action_waits_for_approval_from_the_cli(
    start_responder: Any, fake_job: Any, kit: Any, tmp_path: Path, lab: Path
) -> None:
    job = fake_job("train", lab / "nodes" / "node1" / "metrics", first_rank=2)
    policy = _policy(
        tmp_path,
        "guards: {approval_required: [exclude_node_restart]}\n"
        "rules: [{alertname: StormwatchGpuXidFatal, actions: [exclude_node_restart]}]",
    )
    responder = start_responder("--policy", str(policy), "--lab-run-dir", str(lab))
    _fire(kit, responder, 1, alertname="StormwatchGpuXidFatal", node="node1")
    waiting = kit.wait_for(
        lambda: [e for e in _audit(responder) if e["event"] == "awaiting_approval"], 20, "waiting"
    )
    action_id = waiting[0]["action_id"]
    assert f"stormwatch alerts approve {action_id}" in waiting[0]["reason"]
    time.sleep(0.5)
    assert responder.get("actions")[0]["status"] == "running"
    assert job.terms("agent") == 0

    def approve() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                kit.stormwatch,
                "alerts",
                "approve",
                str(action_id),
                "--url",
                responder.url,
                "--token-file",
                str(responder.token_file),
                "--actor",
                "alice",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    out = approve()
    assert out.returncode == 0, out.stderr
    [action] = _final_actions(kit, responder, 1)
    assert action["status"] == "succeeded", action
    kit.wait_for(lambda: job.terms("agent") == 1, 20, "agent SIGTERM")
    events = [(e["event"], e["actor"]) for e in _audit(responder)]
    assert events == [
        ("awaiting_approval", "responder"),
        ("approved", "cli:alice"),
        ("started", "responder"),
        ("succeeded", "responder"),
    ]
    again = approve()
    assert again.returncode == 1 and "409" in again.stderr


def test_audit_log_is_append_only_and_mirrored_to_jsonl(
    start_responder: Any, fake_job: Any, kit: Any, tmp_path: Path, lab: Path
) -> None:
    fake_job("train", lab / "nodes" / "node0" / "metrics")
    policy = _policy(
        tmp_path, "rules: [{alertname: StormwatchCheckpointStale, actions: [checkpoint_now]}]"
    )
    jsonl = tmp_path / "audit.jsonl"
    responder = start_responder(
        "--policy", str(policy), "--lab-run-dir", str(lab), "--audit-jsonl", str(jsonl)
    )
    _fire(kit, responder, 1, alertname="StormwatchCheckpointStale")
    _final_actions(kit, responder, 1)
    entries = _audit(responder)
    assert [e["event"] for e in entries] == ["started", "succeeded"]
    assert entries[0]["job"] == "train" and entries[0]["node"] == "node0"
    assert entries[0]["reason"] == "alert StormwatchCheckpointStale"
    assert [json.loads(line) for line in jsonl.read_text().splitlines()] == entries
    db = sqlite3.connect(responder.db)
    try:
        for statement in ("UPDATE audit SET reason = 'x'", "DELETE FROM audit"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db.execute(statement)
    finally:
        db.close()


class _SlowRestart(Action):
    """A remedial action that takes a second (a slow platform)."""

    kind = "restart_workers"

    async def run(self, incident: IncidentRecord) -> ActionOutcome:
        await asyncio.sleep(1.0)
        return ActionOutcome(status="succeeded", detail="restarted slowly")


def test_max_concurrent_refuses_actions_beyond_the_limit(
    tmp_path: Path, token_file: tuple[str, Path], kit: Any
) -> None:
    token, path = token_file
    settings = ResponderSettings(
        db_path=tmp_path / "r.sqlite",
        token_file=path,
        port=0,
        policy=parse_policy(
            "guards: {max_concurrent: 2, restart_budget: {max_actions: 9, window: 1h}}"
        ),
    )
    playbook = Playbook({"StormwatchRankCrashLoop": (_SlowRestart(),)})

    async def scenario() -> list[dict[str, Any]]:
        async with Responder(settings, playbook=playbook) as responder:
            headers = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession(headers=headers) as http:
                for n in (1, 2, 3):  # three incidents of three jobs at once
                    alert = kit.alert(
                        starts_at=time.time() - 1,
                        fingerprint=f"{n:016x}",
                        alertname="StormwatchRankCrashLoop",
                        job=f"job{n}",
                    )
                    body = kit.payload(alert, group_key=f"{{}}:{{n={n}}}")
                    async with http.post(f"{responder.url}/v1/alertmanager", json=body) as r:
                        assert r.status == 200
                for _ in range(100):
                    async with http.get(f"{responder.url}/v1/actions") as r:
                        actions: list[dict[str, Any]] = (await r.json())["actions"]
                    if len(actions) == 3 and all(a["status"] in FINAL for a in actions):
                        return actions
                    await asyncio.sleep(0.1)
        raise AssertionError("actions did not finish")

    actions = asyncio.run(scenario())
    assert sorted(a["status"] for a in actions) == ["skipped", "succeeded", "succeeded"]
    [skipped] = [a for a in actions if a["status"] == "skipped"]
    assert skipped["detail"] == "max concurrent actions: 2 running (max 2)"


@pytest.mark.e2e
def test_fc12_burst_of_1000_with_duplicates_retries_and_a_restart_acts_once_per_incident(
    start_responder: Any, kit: Any, tmp_path: Path
) -> None:
    """250 alert groups, each notified 4 times (first delivery, Alertmanager retry, HA twin,
    repeat), 8 senders at once, the responder killed and restarted half-way: every
    accepted notification is stored, every incident gets exactly one action run."""
    import signal
    import threading
    from concurrent.futures import ThreadPoolExecutor

    policy = _policy(tmp_path, "rules: [{alertname: StormwatchBurst, actions: [notify_only]}]")
    responder = start_responder("--policy", str(policy))
    groups, copies = 250, 4
    starts = time.time() - 10
    payloads = []
    for n in range(groups):
        alert = kit.alert(
            starts_at=starts, fingerprint=f"{n:016x}", alertname="StormwatchBurst", job=f"j{n}"
        )
        payloads.append(kit.payload(alert, group_key=f"{{}}:{{burst={n}}}"))
    order = [payloads[i % groups] for i in range(groups * copies)]  # interleaved duplicates
    accepted: list[int] = []
    lock = threading.Lock()
    restarted = threading.Event()
    sent = [0]

    def send(payload: dict[str, Any]) -> None:
        while True:
            try:
                reply = kit.request(
                    "POST",
                    f"{responder.url}/v1/alertmanager",
                    token=responder.token,
                    body=payload,
                    timeout=10,
                )
            except OSError:  # responder down: Alertmanager retries
                time.sleep(0.05)
                continue
            if reply.status == 200:
                with lock:
                    accepted.append(reply.body["notification_id"])
                    sent[0] += 1
                return
            time.sleep(0.05)

    def restart_half_way() -> None:
        kit.wait_for(lambda: sent[0] >= len(order) // 2, 120, "half the burst")
        responder.restart(signal.SIGKILL)
        restarted.set()

    killer = threading.Thread(target=restart_half_way)
    killer.start()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(send, order))
    killer.join(120)
    assert restarted.is_set()

    assert len(accepted) == groups * copies
    notifications = _all(kit, responder, "notifications")
    stored = {n["id"] for n in notifications}
    assert set(accepted) <= stored
    # Stored but never answered: the kill came between commit and reply, the sender
    # retried. At most one per sender in flight.
    assert len(stored) - len(accepted) <= 8
    assert sum(n["new_alerts"] for n in notifications) == groups
    incidents = _all(kit, responder, "incidents")
    assert len(incidents) == groups
    actions = kit.wait_for(
        lambda: (
            (a := _all(kit, responder, "actions"))
            and len(a) == groups
            and all(x["status"] == "succeeded" for x in a)
            and a
        ),
        60,
        "every action succeeded",
    )
    assert sorted(a["incident_id"] for a in actions) == sorted(i["id"] for i in incidents)
    succeeded = [e["action_id"] for e in _all(kit, responder, "audit") if e["event"] == "succeeded"]
    # Each action audited as succeeded exactly once: its status and that entry are one
    # transaction, so the SIGKILL left both or neither (one it caught while running was
    # resumed, not run again after it finished).
    assert sorted(succeeded) == sorted(a["id"] for a in actions)


def test_unapproved_action_is_skipped_after_the_approval_timeout(
    start_responder: Any, fake_job: Any, kit: Any, tmp_path: Path, lab: Path
) -> None:
    job = fake_job("train", lab / "nodes" / "node0" / "metrics")
    policy = _policy(
        tmp_path,
        "guards: {approval_required: [restart_workers], approval_timeout: 1s}\n"
        "rules: [{alertname: StormwatchRankCrashLoop, actions: [restart_workers]}]",
    )
    responder = start_responder("--policy", str(policy), "--lab-run-dir", str(lab))
    _fire(kit, responder, 1, alertname="StormwatchRankCrashLoop")
    [action] = _final_actions(kit, responder, 1)
    assert (action["status"], action["detail"]) == ("skipped", "not approved within 1 s")
    assert job.terms("worker") == 0
    assert [e["event"] for e in _audit(responder)] == ["awaiting_approval", "skipped"]
