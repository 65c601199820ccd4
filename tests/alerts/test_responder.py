"""The responder over real HTTP on loopback: auth, validation, limits, FC-12 dedup, actions.

The incident model case by case (one incident per alert group) is in test_incidents.py.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

# Read-only endpoints plus the webhook: all need the Bearer token.
PROTECTED = [
    ("POST", "/v1/alertmanager"),
    ("GET", "/v1/notifications"),
    ("GET", "/v1/incidents"),
    ("GET", "/v1/actions"),
]


def test_healthz_answers_without_a_token(start_responder: Any, kit: Any) -> None:
    responder = start_responder()
    reply = kit.request("GET", f"{responder.url}/healthz")
    assert reply.status == 200
    assert reply.body == {"status": "ok"}


BAD_AUTHORIZATION = {
    "missing": None,
    "wrong token": "Bearer wrong-token",
    "basic": "Basic dXNlcjpwYXNz",
    "empty bearer": "Bearer",
    "blank": "bearer  ",
    "token prefix": "Bearer {token}x",
}


def test_requests_without_the_right_bearer_token_get_401(start_responder: Any, kit: Any) -> None:
    responder = start_responder()
    for method, path in PROTECTED:
        for case, authorization in BAD_AUTHORIZATION.items():
            headers = (
                {"Authorization": authorization.format(token=responder.token)}
                if authorization is not None
                else {}
            )
            body = kit.payload(kit.alert(starts_at=time.time())) if method == "POST" else None
            reply = kit.request(method, responder.url + path, body=body, headers=headers)
            assert reply.status == 401, (method, path, case)
            assert reply.headers.get("WWW-Authenticate", "").startswith("Bearer")
    # Nothing was stored.
    assert responder.get("notifications") == []


def test_token_scheme_is_case_insensitive(start_responder: Any, kit: Any) -> None:
    responder = start_responder()
    reply = kit.request(
        "GET",
        f"{responder.url}/v1/incidents",
        headers={"Authorization": f"bearer {responder.token}"},
    )
    assert reply.status == 200


def _without(data: dict[str, Any], *path: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(data))
    target = data
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return data


def _with(data: dict[str, Any], value: Any, *path: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(data))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


def _bad_payloads(kit: Any) -> list[tuple[str, dict[str, Any] | bytes, str]]:
    good = kit.payload(kit.alert(starts_at=time.time()))
    return [
        ("missing fingerprint", _without(good, "alerts", 0, "fingerprint"), "alerts.0.fingerprint"),
        ("version 3", _with(good, "3", "version"), "version"),
        ("bad startsAt", _with(good, "yesterday", "alerts", 0, "startsAt"), "alerts.0.startsAt"),
        ("bad status", _with(good, "pending", "status"), "status"),
        ("no alertname", _without(good, "alerts", 0, "labels", "alertname"), "alerts.0.labels"),
        ("no groupKey", _without(good, "groupKey"), "groupKey"),
        ("no alerts", _with(good, [], "alerts"), "alerts"),
        ("not JSON", b"{not json", "body"),
    ]


def test_invalid_payload_gets_400_naming_the_field(start_responder: Any, kit: Any) -> None:
    responder = start_responder()
    for name, body, field in _bad_payloads(kit):
        reply = responder.post(body)
        assert reply.status == 400, name
        fields = [f["field"] for f in reply.body["fields"]]
        assert field in fields, (name, reply.body)
        assert field in reply.body["error"], (name, reply.body)
    assert responder.get("notifications") == []
    assert responder.get("incidents") == []


def test_list_limit_is_validated(start_responder: Any, kit: Any) -> None:
    responder = start_responder()
    reply = kit.request("GET", f"{responder.url}/v1/incidents?limit=-3", token=responder.token)
    assert reply.status == 400
    assert reply.body["fields"][0]["field"] == "limit"


def test_oversize_body_gets_413(start_responder: Any, kit: Any) -> None:
    responder = start_responder("--max-body-bytes", "65536")
    big = kit.payload(kit.alert(starts_at=time.time()))
    big["commonAnnotations"] = {"padding": "x" * 100_000}
    reply = responder.post(big)
    assert reply.status == 413
    # Without Content-Length (chunked): the limit holds while reading.
    parts = urlsplit(responder.url)
    data = json.dumps(big).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/alertmanager HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {responder.token}\r\n".encode()
            + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        try:
            for i in range(0, len(data), 8192):
                chunk = data[i : i + 8192]
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server may close early after answering 413
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    assert responder.get("notifications") == []


def _slow_post(url: str, token: str, payload: dict[str, Any], release: threading.Event) -> bytes:
    """POST whose body arrives in two halves, the second only after ``release``."""
    parts = urlsplit(url)
    data = json.dumps(payload).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/alertmanager HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {token}\r\nContent-Length: {len(data)}\r\n".encode()
            + b"Connection: close\r\n\r\n"
            + data[: len(data) // 2]
        )
        release.wait(30)
        sock.sendall(data[len(data) // 2 :])
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def _abandoned_post(url: str, token: str, payload: dict[str, Any]) -> None:
    """A sender that times out: half the body, then the connection is dropped."""
    parts = urlsplit(url)
    data = json.dumps(payload).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/alertmanager HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {token}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data[: len(data) // 2]
        )


def test_fc12_replays_slow_call_and_restart_give_one_incident_and_one_action(
    start_responder: Any, fake_prometheus: Any, kit: Any
) -> None:
    """FC-12: Alertmanager retries, repeats and resends; exactly one incident and one action."""
    starts_at = time.time() - 3
    fake_prometheus.progress = {"0": starts_at - 1, "1": starts_at - 1}
    responder = start_responder("--prometheus-url", fake_prometheus.url)
    firing = kit.payload(kit.alert(starts_at=starts_at, fingerprint="aa11bb22cc33dd44"))

    # A first call that is slow to arrive, while Alertmanager's retries and repeats
    # (same payload) come in concurrently, plus a sender that gives up half-way.
    release = threading.Event()
    slow_answer: list[bytes] = []
    slow = threading.Thread(
        target=lambda: slow_answer.append(
            _slow_post(responder.url, responder.token, firing, release)
        )
    )
    slow.start()
    _abandoned_post(responder.url, responder.token, firing)
    replies: list[int] = []
    senders = [
        threading.Thread(target=lambda: replies.append(responder.post(firing).status))
        for _ in range(20)
    ]
    for t in senders:
        t.start()
    for t in senders:
        t.join(30)
    release.set()
    slow.join(30)
    assert replies == [200] * 20
    assert slow_answer and slow_answer[0].startswith(b"HTTP/1.1 200"), slow_answer

    incidents = responder.get("incidents")
    assert len(incidents) == 1
    assert incidents[0]["status"] == "open"
    notifications = responder.get("notifications")
    assert len(notifications) == 21
    assert sum(n["new_alerts"] for n in notifications) == 1

    # The action runs once, while the duplicates keep arriving; let it succeed.
    kit.wait_for(lambda: responder.get("actions")[0]["status"] == "running", 15, "action start")
    for _ in range(5):
        assert responder.post(firing).status == 200
    fake_prometheus.restart_now = 1.0
    fake_prometheus.progress = {"0": time.time(), "1": time.time()}
    kit.wait_for(lambda: responder.get("actions")[0]["status"] == "succeeded", 20, "action success")
    baseline_queries = sum(
        "max_over_time(stormwatch_train_job_restarts" in q for q, _ in fake_prometheus.queries
    )

    # A crash and restart of the responder; Alertmanager resends once it is back.
    responder.restart(signal.SIGKILL)
    for _ in range(5):
        assert responder.post(firing).status == 200
    # The same alert in another group (e.g. after a routing change) is still the same incident.
    assert (
        responder.post(
            kit.payload(
                kit.alert(starts_at=starts_at, fingerprint="aa11bb22cc33dd44"),
                group_key="{}:{other}",
            )
        ).status
        == 200
    )
    time.sleep(1.0)

    assert len(responder.get("incidents")) == 1
    actions = responder.get("actions")
    assert len(actions) == 1
    assert actions[0]["kind"] == "confirm_restart"
    assert actions[0]["status"] == "succeeded"
    assert actions[0]["attempts"] == 1
    # The action did not run again after the restart.
    assert (
        sum("max_over_time(stormwatch_train_job_restarts" in q for q, _ in fake_prometheus.queries)
        == baseline_queries
        == 1
    )


def test_resolve_closes_the_incident_once(start_responder: Any, kit: Any) -> None:
    responder = start_responder()
    starts_at = time.time() - 10
    fp = kit.fingerprint()
    assert responder.post(kit.payload(kit.alert(starts_at=starts_at, fingerprint=fp))).status == 200
    [incident] = responder.get("incidents")
    assert incident["status"] == "open" and incident["closed_at"] is None
    assert incident["labels"]["rank"] == "1"
    assert abs(incident["starts_at"] - starts_at) < 1e-3

    ends_at = time.time()
    resolved = kit.payload(
        kit.alert(status="resolved", starts_at=starts_at, ends_at=ends_at, fingerprint=fp)
    )
    for _ in range(3):
        assert responder.post(resolved).status == 200
    [incident] = responder.get("incidents")
    assert incident["status"] == "closed"
    assert incident["closed_at"] >= incident["opened_at"]
    assert abs(incident["ends_at"] - ends_at) < 1e-3
    # Without --prometheus-url the action is recorded as skipped, not run.
    [action] = kit.wait_for(
        lambda: [a for a in responder.get("actions") if a["status"] == "skipped"], 10, "skip"
    )
    assert "--prometheus-url" in action["detail"]


def test_firing_after_resolve_opens_a_new_incident_only_with_a_new_starts_at(
    start_responder: Any, kit: Any
) -> None:
    responder = start_responder()
    fp = kit.fingerprint()
    first = time.time() - 60
    responder.post(kit.payload(kit.alert(starts_at=first, fingerprint=fp)))
    responder.post(
        kit.payload(
            kit.alert(status="resolved", starts_at=first, ends_at=first + 20, fingerprint=fp)
        )
    )
    # An HA twin resends the old firing after the resolve: no new incident, no reopening.
    responder.post(kit.payload(kit.alert(starts_at=first, fingerprint=fp)))
    incidents = responder.get("incidents")
    assert [i["status"] for i in incidents] == ["closed"]

    second = time.time()
    responder.post(kit.payload(kit.alert(starts_at=second, fingerprint=fp)))
    incidents = responder.get("incidents")
    assert [i["status"] for i in incidents] == ["closed", "open"]
    assert abs(incidents[1]["starts_at"] - second) < 1e-3
    assert len(responder.get("actions")) == 2


def test_resolved_without_firing_is_recorded_closed_without_actions(
    start_responder: Any, kit: Any
) -> None:
    responder = start_responder()
    t = time.time() - 30
    responder.post(kit.payload(kit.alert(status="resolved", starts_at=t, ends_at=t + 5)))
    [incident] = responder.get("incidents")
    assert incident["status"] == "closed"
    assert responder.get("actions") == []


def test_group_of_four_ranks_in_one_notification_is_one_incident_with_one_action(
    start_responder: Any, kit: Any
) -> None:
    """The lab's SIGKILL of one rank: torchrun stops its siblings, all four ranks alert."""
    responder = start_responder()
    t = time.time()
    body = kit.payload(
        *(kit.alert(starts_at=t, rank=str(r), fingerprint=kit.fingerprint()) for r in range(4))
    )
    reply = responder.post(body)
    assert reply.status == 200
    assert len(reply.body["incidents_opened"]) == 1
    assert len(reply.body["actions_started"]) == 1
    assert responder.post(body).body["duplicates"] == 4
    [incident] = responder.get("incidents")
    assert [m["labels"]["rank"] for m in incident["members"]] == ["0", "1", "2", "3"]
    assert "rank" not in incident["labels"]
    assert incident["first_alert"]["labels"]["rank"] == "0" and incident["first_alert_tied"]
    [action] = responder.get("actions")
    assert action["incident_id"] == incident["id"]


def test_fc12_group_replayed_joined_and_restarted_runs_confirm_restart_once(
    start_responder: Any, fake_prometheus: Any, kit: Any
) -> None:
    """FC-12 for a group: replays, late siblings, a crash and resends: one incident, one run."""
    t = time.time() - 3
    fake_prometheus.world_size = 4.0
    fake_prometheus.progress = {str(r): t - 1 for r in range(4)}
    responder = start_responder("--prometheus-url", fake_prometheus.url)
    fps = [kit.fingerprint() for _ in range(4)]

    def alert(rank: int, status: str = "firing") -> dict[str, Any]:
        starts = t if rank == 1 else t + 1  # rank 1 died; torchrun stopped the others
        ends = time.time() if status == "resolved" else None
        return kit.alert(
            status=status, starts_at=starts, ends_at=ends, rank=str(rank), fingerprint=fps[rank]
        )

    culprit = kit.payload(alert(1))
    group = kit.payload(*(alert(r) for r in range(4)))
    replies: list[int] = []
    senders = [
        threading.Thread(target=lambda b=body: replies.append(responder.post(b).status))
        for body in [culprit] * 5 + [group] * 5
    ]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(30)
    assert replies == [200] * 10
    [incident] = responder.get("incidents")
    assert len(incident["members"]) == 4
    assert incident["first_alert"]["labels"]["rank"] == "1"
    assert not incident["first_alert_tied"]

    kit.wait_for(lambda: responder.get("actions")[0]["status"] == "running", 15, "action start")
    fake_prometheus.restart_now = 1.0
    fake_prometheus.progress = {str(r): time.time() for r in range(4)}
    kit.wait_for(lambda: responder.get("actions")[0]["status"] == "succeeded", 20, "success")

    responder.restart(signal.SIGKILL)
    for _ in range(3):
        assert responder.post(group).status == 200
    partly = kit.payload(alert(0, "resolved"), alert(1), alert(2, "resolved"), alert(3))
    assert responder.post(partly).body["incidents_closed"] == []
    time.sleep(1.0)

    [incident] = responder.get("incidents")
    assert incident["status"] == "open"
    [action] = responder.get("actions")
    assert action["status"] == "succeeded" and action["attempts"] == 1
    # The baseline query runs once per run of the action: it ran once.
    assert sum(q.startswith("max(max_over_time(") for q, _ in fake_prometheus.queries) == 1
    # The queries watch the incident's job from its first alert's startsAt.
    [(_, at)] = [(q, at) for q, at in fake_prometheus.queries if q.startswith("max(max_over_time(")]
    assert float(at) == pytest.approx(t - 5, abs=0.01)


def test_alert_without_actions_opens_an_incident_only(start_responder: Any, kit: Any) -> None:
    responder = start_responder()
    responder.post(kit.payload(kit.alert(starts_at=time.time(), alertname="SomethingElse")))
    assert len(responder.get("incidents")) == 1
    assert responder.get("actions") == []


def test_confirm_restart_succeeds_once_restarted_and_every_rank_progresses(
    start_responder: Any, fake_prometheus: Any, kit: Any
) -> None:
    starts_at = time.time() - 2
    fake_prometheus.world_size = 4.0
    fake_prometheus.progress = {str(r): starts_at - 1 for r in range(4)}
    responder = start_responder("--prometheus-url", fake_prometheus.url)
    responder.post(kit.payload(kit.alert(starts_at=starts_at, job='tr"ain')))
    kit.wait_for(lambda: responder.get("actions")[0]["status"] == "running", 15, "start")

    # Restarted, but ranks 2 and 3 have not made progress yet: keep waiting.
    fake_prometheus.restart_now = 1.0
    fake_prometheus.progress = {"0": time.time(), "1": time.time(), "2": starts_at - 1}
    time.sleep(3)
    assert responder.get("actions")[0]["status"] == "running"

    fake_prometheus.progress = {str(r): time.time() for r in range(4)}
    confirmed = time.time()
    [action] = kit.wait_for(
        lambda: [a for a in responder.get("actions") if a["status"] == "succeeded"], 15, "success"
    )
    assert action["finished_at"] >= confirmed - 0.5
    assert action["data"]["restart_count_before"] == 0
    assert action["data"]["restart_count_after"] == 1
    assert action["data"]["ranks_progressed"] == ["0", "1", "2", "3"]
    assert action["data"]["confirmed_at"] == pytest.approx(action["finished_at"], abs=1)
    # The queries select the alert's job (label value escaped for PromQL).
    assert all('{training_job="tr\\"ain"}' in q for q, _ in fake_prometheus.queries)
    # The "before" value is read 5 s before the alert started.
    before = [t for q, t in fake_prometheus.queries if "max_over_time" in q]
    assert len(before) == 2  # the job's attempt and each node's count
    assert all(float(at) == pytest.approx(starts_at - 5, abs=0.01) for at in before)


def test_confirm_restart_reports_the_job_restart_count_when_a_peer_node_did_not_count_it(
    start_responder: Any, fake_prometheus: Any, kit: Any
) -> None:
    """The second restart of a job, caused by node1 after node0 caused the first: torchrun's
    node-local counts are 1 and 0 -> 1 and 1 (their max stays 1: "1 -> 1 (not increased)"
    before), the job's attempt goes 1 -> 2, and the confirmation says so, with both."""
    starts_at = time.time() - 2
    fake_prometheus.restart_before = 1.0
    fake_prometheus.restart_now = 1.0
    fake_prometheus.nodes_before = {"node0": 1.0, "node1": 0.0}
    fake_prometheus.nodes_now = {"node0": 1.0, "node1": 0.0}
    fake_prometheus.progress = {"0": starts_at - 1, "1": starts_at - 1}
    responder = start_responder("--prometheus-url", fake_prometheus.url)
    responder.post(kit.payload(kit.alert(starts_at=starts_at)))
    kit.wait_for(lambda: responder.get("actions")[0]["status"] == "running", 15, "start")
    fake_prometheus.restart_now = 2.0
    fake_prometheus.nodes_now = {"node0": 1.0, "node1": 1.0}
    fake_prometheus.progress = {"0": time.time(), "1": time.time()}
    [action] = kit.wait_for(
        lambda: [a for a in responder.get("actions") if a["status"] == "succeeded"], 15, "success"
    )
    assert "restart count 1 -> 2 for the job" in action["detail"], action["detail"]
    assert "node restarts node0 1 -> 1, node1 0 -> 1" in action["detail"], action["detail"]
    assert action["data"]["restart_count_before"] == 1
    assert action["data"]["restart_count_after"] == 2
    assert action["data"]["node_restarts_after"] == {"node0": 1, "node1": 1}


def test_confirm_restart_fails_after_its_timeout(
    start_responder: Any, fake_prometheus: Any, kit: Any
) -> None:
    starts_at = time.time()
    fake_prometheus.progress = {"0": starts_at - 1, "1": starts_at - 1}
    responder = start_responder("--prometheus-url", fake_prometheus.url, "--confirm-timeout", "2s")
    responder.post(kit.payload(kit.alert(starts_at=starts_at)))
    [action] = kit.wait_for(
        lambda: [a for a in responder.get("actions") if a["status"] == "failed"], 15, "failure"
    )
    assert "not increased" in action["detail"]
    assert "0, 1" in action["detail"]
    assert 1.5 <= action["finished_at"] - action["started_at"] <= 10


def test_confirm_restart_keeps_polling_through_prometheus_errors(
    start_responder: Any, fake_prometheus: Any, kit: Any
) -> None:
    starts_at = time.time()
    fake_prometheus.fail = True
    responder = start_responder("--prometheus-url", fake_prometheus.url)
    responder.post(kit.payload(kit.alert(starts_at=starts_at)))
    kit.wait_for(lambda: responder.get("actions")[0]["status"] == "running", 15, "start")
    time.sleep(2.5)
    fake_prometheus.fail = False
    fake_prometheus.restart_now = 1.0
    fake_prometheus.progress = {"0": time.time(), "1": time.time()}
    kit.wait_for(
        lambda: responder.get("actions")[0]["status"] == "succeeded", 15, "success after errors"
    )


def test_interrupted_read_only_action_resumes_after_restart(
    start_responder: Any, fake_prometheus: Any, kit: Any, tmp_path: Path
) -> None:
    starts_at = time.time()
    fake_prometheus.progress = {"0": starts_at - 1, "1": starts_at - 1}
    responder = start_responder("--prometheus-url", fake_prometheus.url)
    responder.post(kit.payload(kit.alert(starts_at=starts_at)))
    kit.wait_for(lambda: responder.get("actions")[0]["status"] == "running", 15, "start")
    responder.restart(signal.SIGKILL)
    fake_prometheus.restart_now = 1.0
    fake_prometheus.progress = {"0": time.time(), "1": time.time()}
    [action] = kit.wait_for(
        lambda: [a for a in responder.get("actions") if a["status"] == "succeeded"], 15, "resume"
    )
    assert action["attempts"] == 2
    assert len(responder.get("actions")) == 1


def test_state_survives_a_graceful_restart(start_responder: Any, kit: Any) -> None:
    responder = start_responder()
    t = time.time()
    responder.post(kit.payload(kit.alert(starts_at=t)))
    assert responder.stop(signal.SIGTERM) == 0
    assert responder.start().get("incidents")[0]["status"] == "open"
