"""A real Alertmanager posting to the real responder (loopback, temporary storage)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from stormwatch.alerts import AlertmanagerSettings, write_alertmanager_config

pytestmark = pytest.mark.e2e


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def start_alertmanager(
    start_service: Any, kit: Any, tmp_path: Path, responder: Any, **timing: float
) -> str:
    """Alertmanager on a free loopback port, clustering off, routing to ``responder``."""
    config = write_alertmanager_config(
        AlertmanagerSettings(
            responder_url=responder.url, token_file=responder.token_file, **timing
        ),
        tmp_path / "alertmanager.yml",
    )
    port = kit.free_port()
    return start_service(
        "prometheus-alertmanager",
        [
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        port,
    )


def test_alertmanager_notification_opens_one_incident_and_resolve_closes_it(
    start_responder: Any, start_service: Any, kit: Any, tmp_path: Path
) -> None:
    responder = start_responder()
    # Alertmanager re-sends the unchanged firing group every second (repeat_interval).
    am_url = start_alertmanager(
        start_service,
        kit,
        tmp_path,
        responder,
        group_wait_s=1.0,
        group_interval_s=1.0,
        repeat_interval_s=1.0,
    )
    starts_at = time.time() - 2
    alert = {
        "labels": {
            "alertname": "StormwatchRankStalled",
            "training_job": "e2e",
            "rank": "1",
            "severity": "critical",
        },
        "annotations": {"summary": "Rank 1 of job e2e stopped making progress"},
        "startsAt": _rfc3339(starts_at),
        "endsAt": _rfc3339(time.time() + 300),
        "generatorURL": "http://127.0.0.1:19090/graph",
    }
    # Prometheus re-sends active alerts every evaluation; do the same a few times.
    for _ in range(3):
        assert kit.request("POST", f"{am_url}/api/v2/alerts", body=[alert]).status == 200
        time.sleep(0.5)

    [incident] = kit.wait_for(lambda: responder.get("incidents"), 30, "an incident")
    assert incident["status"] == "open"
    assert incident["labels"]["training_job"] == "e2e" and incident["labels"]["rank"] == "1"
    assert incident["starts_at"] == pytest.approx(starts_at, abs=0.01)
    # Alertmanager repeats the firing notification; the repeats change nothing.
    kit.wait_for(
        lambda: sum(n["status"] == "firing" for n in responder.get("notifications")) >= 3,
        30,
        "repeated notifications",
    )
    assert len(responder.get("incidents")) == 1
    assert len(responder.get("actions")) == 1

    ended = time.time()
    resolved = {**alert, "endsAt": _rfc3339(ended)}
    assert kit.request("POST", f"{am_url}/api/v2/alerts", body=[resolved]).status == 200
    [incident] = kit.wait_for(
        lambda: [i for i in responder.get("incidents") if i["status"] == "closed"], 30, "closed"
    )
    assert incident["ends_at"] == pytest.approx(ended, abs=0.01)
    assert len(responder.get("incidents")) == 1
    notifications = responder.get("notifications")
    assert {n["status"] for n in notifications} == {"firing", "resolved"}
    assert all(n["receiver"] == "stormwatch-responder" for n in notifications)


def test_alertmanager_group_of_four_ranks_is_one_incident_until_all_resolve(
    start_responder: Any, start_service: Any, kit: Any, tmp_path: Path
) -> None:
    """A dead rank plus the siblings torchrun stopped: one group, one incident, one action."""
    responder = start_responder()
    am_url = start_alertmanager(
        start_service,
        kit,
        tmp_path,
        responder,
        group_wait_s=1.0,
        group_interval_s=1.0,
        repeat_interval_s=3600.0,
    )
    killed = time.time() - 5

    def alert(rank: int, starts_at: float, ends_at: float) -> dict[str, Any]:
        return {
            "labels": {
                "alertname": "StormwatchRankStalled",
                "training_job": "e2e-group",
                "rank": str(rank),
                "severity": "critical",
            },
            "annotations": {"summary": f"Rank {rank} of job e2e-group stopped making progress"},
            "startsAt": _rfc3339(starts_at),
            "endsAt": _rfc3339(ends_at),
        }

    def send(*alerts: dict[str, Any]) -> None:
        assert kit.request("POST", f"{am_url}/api/v2/alerts", body=list(alerts)).status == 200

    def starts(rank: int) -> float:
        return killed if rank == 1 else killed + 1  # rank 1 died, the others were stopped

    later = time.time() + 300
    send(alert(1, starts(1), later))
    send(*(alert(r, starts(r), later) for r in range(4)))

    def members() -> list[dict[str, Any]]:
        incidents = responder.get("incidents")
        return incidents[0]["members"] if incidents and len(incidents[0]["members"]) == 4 else []

    kit.wait_for(members, 30, "one incident with all four ranks")
    [incident] = responder.get("incidents")
    assert incident["first_alert"]["labels"]["rank"] == "1"
    assert not incident["first_alert_tied"]
    assert incident["labels"] == {
        "alertname": "StormwatchRankStalled",
        "training_job": "e2e-group",
        "severity": "critical",
    }
    assert incident["group_labels"] == {
        "alertname": "StormwatchRankStalled",
        "training_job": "e2e-group",
    }
    assert len(responder.get("actions")) == 1

    # The stopped siblings come back first: the incident stays open.
    now = time.time()
    send(*(alert(r, starts(r), now) for r in (0, 2, 3)))
    kit.wait_for(
        lambda: (
            sum(m["status"] == "resolved" for m in responder.get("incidents")[0]["members"]) == 3
        ),
        30,
        "three members resolved",
    )
    assert responder.get("incidents")[0]["status"] == "open"

    send(alert(1, starts(1), time.time()))
    kit.wait_for(lambda: responder.get("incidents")[0]["status"] == "closed", 30, "the close")

    # The same rank dies again later: a new incident with its own action.
    again = time.time()
    send(alert(1, again, again + 300))
    incidents = kit.wait_for(
        lambda: (i := responder.get("incidents")) and len(i) == 2 and i, 30, "a second incident"
    )
    assert [i["status"] for i in incidents] == ["closed", "open"]
    assert incidents[1]["starts_at"] == pytest.approx(again, abs=0.01)
    assert len(responder.get("actions")) == 2


def test_alertmanager_inhibits_a_down_nodes_and_a_lost_gpus_other_alerts(
    start_responder: Any, start_service: Any, kit: Any, tmp_path: Path
) -> None:
    responder = start_responder()
    am_url = start_alertmanager(start_service, kit, tmp_path, responder)
    now = time.time()

    def alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
        return {
            "labels": {"alertname": name, "severity": severity, **labels},
            "startsAt": _rfc3339(now - 5),
            "endsAt": _rfc3339(now + 300),
        }

    sent = [
        alert("StormwatchNodeDown", "critical", node="node1", job="stormwatch-agent"),
        alert("StormwatchRankCrashLoop", "critical", node="node1", training_job="j", rank="1"),
        alert("StormwatchRankCrashLoop", "critical", node="node0", training_job="j", rank="0"),
        alert("StormwatchGpuLost", "critical", node="node0", gpu="3"),
        alert("StormwatchGpuXidFatal", "critical", node="node0", gpu="3", code="79"),
        alert("StormwatchGpuXidFatal", "critical", node="node0", gpu="2", code="79"),
        alert("StormwatchRankStalled", "critical", training_job="j", rank="1"),
    ]
    assert kit.request("POST", f"{am_url}/api/v2/alerts", body=sent).status == 200

    def states() -> dict[tuple[str, str], str] | None:
        alerts = kit.request("GET", f"{am_url}/api/v2/alerts").body
        if len(alerts) < len(sent):
            return None
        return {
            (a["labels"]["alertname"], a["labels"].get("node", "") + a["labels"].get("gpu", "")): (
                a["status"]["state"]
            )
            for a in alerts
        }

    expected = {
        ("StormwatchNodeDown", "node1"): "active",
        ("StormwatchRankCrashLoop", "node1"): "suppressed",  # its node is down
        ("StormwatchRankCrashLoop", "node0"): "active",
        ("StormwatchGpuLost", "node03"): "active",
        ("StormwatchGpuXidFatal", "node03"): "suppressed",  # that GPU is lost
        ("StormwatchGpuXidFatal", "node02"): "active",
        ("StormwatchRankStalled", ""): "active",  # no node label: never muted
    }
    # Alertmanager's inhibitor learns of source alerts on its own goroutine (it subscribes
    # to the alert store), while the API marks an alert's state as it reads it: a read just
    # after the POST may find a target "active" because its source is not yet in the
    # inhibitor's cache (cc31). Inhibition is eventually consistent, so the states are read
    # until they match, for up to 30 s; a rule that never mutes still fails, with a diff.
    deadline = time.monotonic() + 30
    got = states()
    while got != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        got = states()
    assert got == expected
