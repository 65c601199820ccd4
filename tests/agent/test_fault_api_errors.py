"""The fault API's answers to bad requests: 400 naming the field for what the request
breaks (cross-field rules, the GPU's own limits, NaN), 409 for a repeat of a fault that
failed, and JSON for aiohttp's own errors (404, 405, 413)."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from stormwatch.agent import FakeNvml


def _post(agent: Any, tools: Any, body: Any) -> Any:
    return tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "trainer_fault", "rank": 0, "point": "slow_step"}, "seconds"),
        ({"kind": "trainer_fault", "rank": 0, "point": "error_at_step"}, "step"),
        (
            {"kind": "trainer_fault", "rank": 0, "point": "error_at_step", "step": 3, "op": "x"},
            "op",
        ),
        ({"kind": "trainer_fault", "rank": 0, "point": "collective_hang", "step": 3}, "step"),
        ({"kind": "gpu_power_cap", "gpu": 0}, "watts"),
        ({"kind": "link_flap", "period_seconds": 1.0, "down_seconds": 2.0}, "down_seconds"),
        ({"kind": "gpu_power_cap", "gpu": 0, "max_clock_mhz": 1}, "max_clock_mhz"),
        ({"kind": "kill_rank", "rank": 0, "ttl_seconds": float("nan")}, "ttl_seconds"),
    ],
)
def test_a_broken_cross_field_rule_is_400_naming_the_field(
    start_agent: Any, tools: Any, body: dict[str, Any], field: str
) -> None:
    agent = start_agent()
    reply = _post(agent, tools, {"id": "bad", **body})
    assert reply.status == 400, reply.text
    answer = reply.json()
    assert [entry["field"] for entry in answer["fields"]] == [field], answer
    assert tools.http("GET", agent.fault_url + "/v1/faults/bad", token=tools.token).status == 404


def test_nan_names_a_finite_number_not_a_bound(start_agent: Any, tools: Any) -> None:
    agent = start_agent()
    body = {"id": "n", "kind": "kill_rank", "rank": 0, "ttl_seconds": float("nan")}
    assert "finite number" in _post(agent, tools, body).json()["error"]


@pytest.mark.parametrize("watts", [100, 199, 701, 4999])
def test_a_power_cap_outside_the_gpu_range_is_400_naming_the_range(
    start_agent: Any, tools: Any, watts: int
) -> None:
    fake = FakeNvml(2)
    agent = start_agent(fake=fake)
    reply = _post(agent, tools, {"id": "pc", "kind": "gpu_power_cap", "gpu": 0, "watts": watts})
    assert reply.status == 400, reply.text
    answer = reply.json()
    assert answer["fields"][0]["field"] == "watts"
    assert "200 to 700 W" in answer["error"], answer
    assert fake.gpus[0].power_limit_mw == 700_000
    # Nothing was recorded: the same id with a valid value is a new fault.
    fixed = _post(agent, tools, {"id": "pc", "kind": "gpu_power_cap", "gpu": 0, "watts": 300})
    assert fixed.status == 201, fixed.text


def test_a_power_cap_on_a_missing_gpu_is_404(start_agent: Any, tools: Any) -> None:
    agent = start_agent()
    reply = _post(agent, tools, {"id": "pc", "kind": "gpu_power_cap", "gpu": 7, "watts": 300})
    assert reply.status == 404 and "no GPU 7" in reply.json()["error"], reply.text


def test_a_repeat_of_a_failed_fault_is_409_telling_to_use_a_new_id(
    start_agent: Any, tools: Any
) -> None:
    fake = FakeNvml(2)
    agent = start_agent(fake=fake)
    fake.inject_error("nvmlDeviceSetPowerManagementLimit", pynvml.NVML_ERROR_NO_PERMISSION)
    body = {"id": "pc", "kind": "gpu_power_cap", "gpu": 0, "watts": 300}
    first = _post(agent, tools, body)
    assert first.status == 500, first.text
    again = _post(agent, tools, body)
    assert again.status == 409, again.text
    error = again.json()["error"]
    assert "'pc' failed" in error and "new id" in error, error
    fake.clear_errors()
    assert _post(agent, tools, {**body, "id": "pc2"}).status == 201


@pytest.mark.parametrize(
    ("method", "path", "raw", "status", "words"),
    [
        ("PUT", "/v1/faults", b"{}", 405, "POST"),
        ("GET", "/v1/nothing", None, 404, "/v1/nothing"),
        ("POST", "/v1/faults", b"{" + b" " * (5 * 1024 * 1024) + b"}", 413, "limit"),
    ],
)
def test_aiohttp_errors_are_json(
    start_agent: Any, tools: Any, method: str, path: str, raw: bytes | None, status: int, words: str
) -> None:
    agent = start_agent()
    reply = tools.http(method, agent.fault_url + path, raw=raw, token=tools.token)
    assert reply.status == status
    assert reply.headers["Content-Type"].startswith("application/json"), reply.headers
    assert words in reply.json()["error"]
    if status == 405:
        assert "POST" in reply.headers["Allow"]


def test_the_read_only_listener_answers_json_errors_too(start_agent: Any, tools: Any) -> None:
    agent = start_agent()
    reply = tools.http("DELETE", agent.url + "/metrics")
    assert reply.status == 405 and "GET" in reply.json()["error"]
