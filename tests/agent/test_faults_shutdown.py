"""A clean stop reverts every applied fault while what it acts on (NVML) is still open,
and fails loudly when one stays applied."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pynvml
import pytest

from stormwatch.agent import FakeNvml, FaultsLeftApplied

DEFAULT_LIMIT_MW = 700_000


@pytest.mark.parametrize(
    "caps", [{"watts": 300}, {"max_clock_mhz": 900}, {"watts": 250, "max_clock_mhz": 1000}]
)
def test_fc13_clean_stop_reverts_gpu_power_cap_before_nvml_shuts_down(
    start_agent: Any, tools: Any, tmp_path: Path, caps: dict[str, int]
) -> None:
    fake = FakeNvml(2)
    first = start_agent(fake=fake)
    body = {"id": "pc1", "kind": "gpu_power_cap", "gpu": 0, "ttl_seconds": 600, **caps}
    reply = tools.http("POST", first.fault_url + "/v1/faults", body=body, token=tools.token)
    assert reply.status == 201, reply.text
    first.stop()
    assert fake.gpus[0].power_limit_mw == DEFAULT_LIMIT_MW
    assert fake.gpus[0].locked_clocks_mhz is None
    second = start_agent(state_dir=tmp_path / "state")
    record = tools.http("GET", second.fault_url + "/v1/faults/pc1", token=tools.token).json()
    assert record["state"] == "reverted" and record["revert_reason"] == "shutdown", record


def test_a_fault_left_applied_at_stop_fails_the_stop(start_agent: Any, tools: Any) -> None:
    fake = FakeNvml(2)
    agent = start_agent(fake=fake)
    body = {"id": "stuck", "kind": "gpu_power_cap", "gpu": 1, "watts": 300, "ttl_seconds": 600}
    reply = tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
    assert reply.status == 201, reply.text
    fake.inject_error("nvmlDeviceSetPowerManagementLimit", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(FaultsLeftApplied, match="stuck") as raised:
        asyncio.run_coroutine_threadsafe(agent.agent.stop(), agent._loop).result(60)
    assert raised.value.fault_ids == ("stuck",)
    fake.clear_errors()


def test_fc13_agent_process_reverts_a_power_cap_on_sigterm_and_exits_0(
    agent_process: Any, tools: Any
) -> None:
    agent = agent_process()
    body = {"id": "pc1", "kind": "gpu_power_cap", "gpu": 0, "watts": 300, "ttl_seconds": 600}
    reply = tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
    assert reply.status == 201, reply.text
    assert agent.stop(signal.SIGTERM) == 0
    log = agent.log.read_text()
    assert "not reverted" not in log and "pc1 (gpu_power_cap) reverted: shutdown" in log, log
