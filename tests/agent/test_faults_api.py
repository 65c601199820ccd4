"""The fault API: auth, validation, kill_rank on real processes, TTL, idempotency, durable ledger."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from stormwatch.agent import AgentConfig, AgentConfigError


def _kill(rank: int, fault_id: str, **extra: Any) -> dict[str, Any]:
    return {"id": fault_id, "kind": "kill_rank", "rank": rank, "signal": "SIGKILL", **extra}


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --------------------------------------------------------------------- auth
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/faults"),
        ("GET", "/v1/faults"),
        ("GET", "/v1/faults/x"),
        ("DELETE", "/v1/faults/x"),
    ],
)
@pytest.mark.parametrize("token", [None, "wrong-token", ""])
def test_fault_api_without_valid_token_is_401(
    start_agent: Any, tools: Any, method: str, path: str, token: str | None
) -> None:
    agent = start_agent()
    reply = tools.http(method, agent.fault_url + path, body=_kill(0, "a"), token=token)
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert tools.http("GET", agent.fault_url + "/v1/faults", token=tools.token).status == 200


def test_fault_api_does_not_listen_unless_enabled(start_agent: Any, tools: Any) -> None:
    agent = start_agent(fault_listen_host=None)
    assert agent.fault_url == ""
    reply = tools.http("POST", agent.url + "/v1/faults", body=_kill(0, "a"), token=tools.token)
    assert reply.status in (404, 405), "not served by the read-only listener"
    assert tools.http("GET", agent.url + "/v1/faults", token=tools.token).status == 404
    assert tools.http("GET", agent.url + "/metrics").status == 200


def test_fault_api_without_a_token_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match=r"--fault-api-listen.*--token-file") as caught:
        AgentConfig.build(metrics_dir=tmp_path, fault_listen_host="127.0.0.1", fault_listen_port=0)
    assert str(caught.value).startswith("agent config: fault_listen"), "no 'config: config:'"


def test_fault_api_is_not_served_by_the_metrics_listener(start_agent: Any, tools: Any) -> None:
    agent = start_agent()
    assert tools.http("GET", agent.url + "/v1/faults", token=tools.token).status == 404
    assert tools.http("GET", agent.fault_url + "/metrics").status == 401, "token first"
    assert tools.http("GET", agent.fault_url + "/metrics", token=tools.token).status == 404


# --------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"id": "a", "kind": "kill_rank", "rank": "zero"}, "rank"),
        ({"id": "a", "kind": "kill_rank", "rank": -1}, "rank"),
        ({"kind": "kill_rank", "rank": 0}, "id"),
        ({"id": "a b", "kind": "kill_rank", "rank": 0}, "id"),
        ({"id": "a", "kind": "kill_rank", "rank": 0, "signal": "SIGSTOP"}, "signal"),
        ({"id": "a", "kind": "kill_rank", "rank": 0, "ttl_seconds": 0}, "ttl_seconds"),
        ({"id": "a", "kind": "kill_rank", "rank": 0, "ttl_seconds": 10**9}, "ttl_seconds"),
        ({"id": "a", "kind": "kill_rank", "rank": 0, "bogus": 1}, "bogus"),
        ({"id": "a", "kind": "melt_gpu", "rank": 0}, "kind"),
        ({"id": "a", "rank": 0}, "kind"),
        ([1, 2], "body"),
        (b"{not json", "body"),
        # Strict types: a JSON string is not a rank, true is not 1, 0.0 is not 0.
        ({"id": "a", "kind": "kill_rank", "rank": "0"}, "rank"),
        ({"id": "a", "kind": "kill_rank", "rank": True}, "rank"),
        ({"id": "a", "kind": "kill_rank", "rank": 0.0}, "rank"),
        ({"id": "a", "kind": "kill_rank", "rank": 0, "ttl_seconds": "5"}, "ttl_seconds"),
        ({"id": 1, "kind": "kill_rank", "rank": 0}, "id"),
        # 30000 '[' overflowed json.loads' recursion: a 500 with a RecursionError.
        (b"[" * 30000, "body"),
        (
            b'{"id": "a", "kind": "kill_rank", "rank": 0, "x": ' + b"[" * 40 + b"]" * 40 + b"}",
            "body",
        ),
    ],
)
def test_bad_fault_body_is_400_naming_the_field(
    start_agent: Any, tools: Any, body: Any, field: str
) -> None:
    agent = start_agent()
    kwargs = {"raw": body} if isinstance(body, bytes) else {"body": body}
    reply = tools.http("POST", agent.fault_url + "/v1/faults", token=tools.token, **kwargs)
    assert reply.status == 400
    answer = reply.json()
    assert field in [entry["field"] for entry in answer["fields"]]
    assert field in answer["error"]


def test_deeply_nested_body_is_400_naming_the_nesting(start_agent: Any, tools: Any) -> None:
    agent = start_agent()
    reply = tools.http("POST", agent.fault_url + "/v1/faults", token=tools.token, raw=b"[" * 30000)
    assert reply.status == 400 and "nested" in reply.json()["error"]
    # Brackets inside strings do not count.
    body = {"id": "a", "kind": "kill_rank", "rank": 77, "job": "[" * 100}
    reply = tools.http("POST", agent.fault_url + "/v1/faults", token=tools.token, body=body)
    assert reply.status == 404, reply.text


def test_integer_ttl_is_still_accepted_as_seconds(start_agent: Any, tools: Any) -> None:
    agent = start_agent()
    body = {"id": "a", "kind": "kill_rank", "rank": 77, "job": "none", "ttl_seconds": 5}
    reply = tools.http("POST", agent.fault_url + "/v1/faults", token=tools.token, body=body)
    assert reply.status == 404, reply.text  # valid request; the rank is just not here


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_fault_body_must_be_application_json(
    start_agent: Any, tools: Any, content_type: str
) -> None:
    agent = start_agent()
    reply = tools.http(
        "POST",
        agent.fault_url + "/v1/faults",
        token=tools.token,
        body=_kill(0, "a", job="j"),
        content_type=content_type,
    )
    assert reply.status == 415 and "application/json" in reply.json()["error"]
    charset = tools.http(
        "POST",
        agent.fault_url + "/v1/faults",
        token=tools.token,
        body=_kill(77, "a", job="j"),
        content_type="application/json; charset=utf-8",
    )
    assert charset.status == 404, charset.text


def test_oversized_fault_body_is_413(start_agent: Any, tools: Any) -> None:
    agent = start_agent()
    body = _kill(0, "big", job="x" * (128 * 1024))
    assert (
        tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token).status
        == 413
    )


def test_unknown_rank_is_404_and_leaves_no_record(start_agent: Any, tools: Any) -> None:
    agent = start_agent()
    reply = tools.http(
        "POST",
        agent.fault_url + "/v1/faults",
        body=_kill(77, "nope", job="no-such-job"),
        token=tools.token,
    )
    assert reply.status == 404 and "rank 77" in reply.json()["error"]
    assert tools.http("GET", agent.fault_url + "/v1/faults", token=tools.token).json() == {
        "faults": []
    }


# ---------------------------------------------------------------- kill_rank
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_kill_rank_signals_the_rank_process(
    start_agent: Any, fake_torchrun: Any, tools: Any, sig: str
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0, 1])
    victim, bystander = launcher.wait_pid(1), launcher.wait_pid(0)
    before = time.time()
    reply = tools.http(
        "POST",
        agent.fault_url + "/v1/faults",
        body={
            "id": f"kill-{sig}",
            "kind": "kill_rank",
            "rank": 1,
            "job": launcher.job,
            "signal": sig,
            "ttl_seconds": 30,
        },
        token=tools.token,
    )
    assert reply.status == 201, reply.text
    record = reply.json()
    assert record["id"] == f"kill-{sig}" and record["kind"] == "kill_rank"
    assert record["target_pid"] == victim and record["state"] == "applied"
    assert before <= record["applied_at"] <= time.time()
    assert record["expires_at"] == pytest.approx(record["applied_at"] + 30)
    assert record["details"]["signal"] == sig
    tools.wait_for(lambda: _gone(victim))
    assert not _gone(bystander)
    exits = tools.wait_for(
        lambda: tools.scrape(agent.url).value(
            "stormwatch_rank_unexpected_exits_total", training_job=launcher.job, rank="1"
        )
    )
    assert exits == 1
    scrape = tools.scrape(agent.url)
    assert scrape.value("stormwatch_faults_injected_total", kind="kill_rank") == 1
    assert scrape.value("stormwatch_faults_active", kind="kill_rank") == 1


def test_sigkill_with_quick_torchrun_restart_is_still_counted(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent(rank_scan_interval=1.0)  # the production period
    launcher = fake_torchrun([0], restart=True, restart_delay=0.0)
    first = launcher.wait_pid(0)
    tools.wait_for(
        lambda: tools.scrape(agent.url).value(
            "stormwatch_rank_up", training_job=launcher.job, rank="0"
        )
    )
    reply = tools.http(
        "POST",
        agent.fault_url + "/v1/faults",
        body=_kill(0, "quick", job=launcher.job),
        token=tools.token,
    )
    assert reply.status == 201
    second = launcher.wait_pid(0, count=2)  # restarted within tens of milliseconds
    assert second != first

    def counted() -> Any:
        scrape = tools.scrape(agent.url)
        return (
            scrape.value(
                "stormwatch_rank_unexpected_exits_total", training_job=launcher.job, rank="0"
            )
            == 1
            and scrape
        )

    tools.wait_for(counted)
    # The exit event starts a scan at once, which may come before the restarted rank; the
    # next one finds it: up again, and the exit still counted once.
    scrape = tools.wait_for(
        lambda: (
            (s := counted())
            and s.value("stormwatch_rank_up", training_job=launcher.job, rank="0") == 1
            and s
        )
    )
    assert (
        scrape.value("stormwatch_rank_unexpected_exits_total", training_job=launcher.job, rank="0")
        == 1
    )


def test_same_fault_id_twice_has_one_effect(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0], restart=True)
    first = launcher.wait_pid(0)
    body = _kill(0, "once", job=launcher.job)
    assert (
        tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token).status
        == 201
    )
    second = launcher.wait_pid(0, count=2)
    tools.wait_for(lambda: tools.http("GET", agent.url + "/v1/ranks").json()["ranks"])
    again = tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
    assert again.status == 200 and again.json()["target_pid"] == first
    time.sleep(0.3)
    assert not _gone(second), "a repeated request killed the restarted rank"
    conflict = tools.http(
        "POST",
        agent.fault_url + "/v1/faults",
        body={**body, "signal": "SIGTERM"},
        token=tools.token,
    )
    assert conflict.status == 409
    listed = tools.http("GET", agent.fault_url + "/v1/faults", token=tools.token).json()["faults"]
    assert [f["id"] for f in listed] == ["once"]


# ---------------------------------------------------------- TTL and revert
def test_ttl_expiry_is_recorded(start_agent: Any, fake_torchrun: Any, tools: Any) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0])
    launcher.wait_pid(0)
    body = _kill(0, "short", job=launcher.job, ttl_seconds=0.3)
    assert (
        tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token).status
        == 201
    )

    def expired() -> Any:
        record = tools.http("GET", agent.fault_url + "/v1/faults/short", token=tools.token).json()
        return record if record["state"] == "reverted" else None

    record = tools.wait_for(expired)
    assert record["revert_reason"] == "ttl"
    assert record["reverted_at"] >= record["expires_at"]
    scrape = tools.scrape(agent.url)
    assert scrape.value("stormwatch_faults_reverted_total", kind="kill_rank", reason="ttl") == 1
    assert scrape.value("stormwatch_faults_active", kind="kill_rank") == 0


def test_delete_reverts_now_and_is_idempotent(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0])
    launcher.wait_pid(0)
    body = _kill(0, "del", job=launcher.job)
    assert (
        tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token).status
        == 201
    )
    first = tools.http("DELETE", agent.fault_url + "/v1/faults/del", token=tools.token)
    assert first.status == 200 and first.json()["state"] == "reverted"
    assert first.json()["revert_reason"] == "request"
    second = tools.http("DELETE", agent.fault_url + "/v1/faults/del", token=tools.token)
    assert second.status == 200 and second.json() == first.json()
    assert (
        tools.http("DELETE", agent.fault_url + "/v1/faults/unknown", token=tools.token).status
        == 404
    )


def test_ledger_survives_agent_crash_and_ttl_still_expires(
    agent_process: Any, start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    crashed = agent_process()
    launcher = fake_torchrun([0, 1])
    launcher.wait_pid(0), launcher.wait_pid(1)
    tools.wait_for(lambda: len(tools.http("GET", crashed.url + "/v1/ranks").json()["ranks"]) >= 2)
    for fault_id, rank, ttl in (("old", 0, 0.5), ("live", 1, 3.0)):
        body = _kill(rank, fault_id, job=launcher.job, ttl_seconds=ttl)
        assert (
            tools.http(
                "POST", crashed.fault_url + "/v1/faults", body=body, token=tools.token
            ).status
            == 201
        )
    applied = {
        f["id"]: f
        for f in tools.http("GET", crashed.fault_url + "/v1/faults", token=tools.token).json()[
            "faults"
        ]
    }
    assert (
        crashed.stop(signal.SIGKILL) == -signal.SIGKILL
    )  # no clean shutdown: faults stay "applied"
    time.sleep(0.6)  # "old" expires while no agent runs

    agent = start_agent(state_dir=tmp_path / "state")
    records = {
        f["id"]: f
        for f in tools.http("GET", agent.fault_url + "/v1/faults", token=tools.token).json()[
            "faults"
        ]
    }
    assert records["old"]["state"] == "reverted" and records["old"]["revert_reason"] == "ttl"
    assert records["old"]["applied_at"] == applied["old"]["applied_at"]
    assert records["live"]["state"] == "applied"
    assert records["live"]["target_pid"] == applied["live"]["target_pid"]

    def live_expired() -> bool:
        record = tools.http("GET", agent.fault_url + "/v1/faults/live", token=tools.token).json()
        return record["state"] == "reverted" and record["revert_reason"] == "ttl"

    tools.wait_for(live_expired)
    # The same id after the restart still has one effect.
    again = tools.http(
        "POST",
        agent.fault_url + "/v1/faults",
        body=_kill(1, "live", job=launcher.job, ttl_seconds=3.0),
        token=tools.token,
    )
    assert again.status == 200


def test_clean_shutdown_completes_active_faults(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    first = start_agent()
    launcher = fake_torchrun([0])
    launcher.wait_pid(0)
    body = _kill(0, "bye", job=launcher.job, ttl_seconds=600)
    assert (
        tools.http("POST", first.fault_url + "/v1/faults", body=body, token=tools.token).status
        == 201
    )
    first.stop()
    second = start_agent(state_dir=tmp_path / "state")
    record = tools.http("GET", second.fault_url + "/v1/faults/bye", token=tools.token).json()
    assert record["state"] == "reverted" and record["revert_reason"] == "shutdown"
