"""The catalogue's experiment models and how the controller turns them into agent requests."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, get_args

import aiohttp
import pytest
from pydantic import TypeAdapter, ValidationError

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import FaultError
from stormwatch.chaos.execution.injection.placement import plan_requests
from stormwatch.chaos.ledger.undo import undo_fault
from stormwatch.contracts.fault_ledger import FaultTarget
from stormwatch.faults import AGENT_KINDS, REGISTRY, AnyExperimentFault, Placement, parse_request
from stormwatch.lab.errors import LabError
from stormwatch.platforms import AgentEndpoint

FAULT: TypeAdapter[Any] = TypeAdapter(AnyExperimentFault)
#: Kinds whose effect is final (a kill): nothing to undo, revert only closes the record.
FINAL_KINDS = {name for name, d in REGISTRY.items() if d.traits.final}
AGENTS = (
    AgentEndpoint(node="n0", url="http://10.0.0.10:9400", fault_url="http://10.0.0.10:9401"),
    AgentEndpoint(node="n1", url="http://10.0.0.11:9400", fault_url="http://10.0.0.11:9401"),
    AgentEndpoint(node="n2", url="http://10.0.0.12:9400", fault_url="http://10.0.0.12:9401"),
)

#: One valid experiment fault per kind (the YAML an operator writes).
EXAMPLES: list[dict[str, Any]] = [
    {"kind": "kill_rank", "rank": 1},
    {"kind": "freeze_rank", "rank": 1},
    {"kind": "freeze_ranks", "node": "n1", "include_torchrun": True},
    {"kind": "kill_torchrun", "rank": 2},
    {"kind": "kill_node_processes", "node": "n1"},
    {"kind": "kill_rdzv_host"},
    {"kind": "kill_agent", "node": "n2", "signal": "SIGTERM"},
    {"kind": "partition", "nodes": ["n0"], "direction": "outbound"},
    {"kind": "isolate_store", "node": "n1"},
    {"kind": "bandwidth_limit", "node": "n1", "rate_kbit": 10_000},
    {"kind": "packet_drop", "node": "n1", "probability": 0.1, "peers": ["n0"]},
    {"kind": "link_flap", "node": "n1", "period_seconds": 2, "down_seconds": 0.5},
    {"kind": "cpu_throttle", "rank": 3, "cpu_fraction": 0.25},
    {"kind": "trainer_fault", "rank": 3, "point": "slow_step", "seconds": 0.2},
    {"kind": "trainer_fault", "rank": 0, "point": "collective_hang", "op": "all_reduce"},
    {"kind": "trainer_fault", "rank": 0, "point": "error_at_step", "step": 12},
    {"kind": "gpu_xid", "node": "n0", "gpu": 1, "xid": 79},
    {"kind": "gpu_throttle", "node": "n0", "reason": "power"},
    {"kind": "nvlink_down", "node": "n0", "links": [0, 1]},
    {"kind": "nvlink_errors", "node": "n0", "counter": "crc_data", "count": 10},
    {"kind": "gpu_lost", "rank": 0},
    {"kind": "gpu_power_cap", "node": "n0", "watts": 400.0},
    {"kind": "checkpoint_readonly", "node": "n0"},
    {"kind": "checkpoint_full", "rank": 0, "path": "/shared/ckpt"},
]


#: Kinds the controller does not plan into request sets: it applies ``freeze_rank`` itself,
#: and asks the agent of ``kill_rank``'s rank directly (their placement traits).
OWN_CLASSES = tuple(
    name
    for name, d in REGISTRY.items()
    if d.traits.placement in (Placement.CONTROLLER, Placement.RANK_AGENT)
)


def test_the_examples_cover_the_catalogue_and_every_agent_kind_has_a_controller_model() -> None:
    kinds = {FAULT.validate_python(body).kind for body in EXAMPLES}
    models = get_args(get_args(AnyExperimentFault)[0])
    assert kinds == {get_args(m.model_fields["kind"].annotation)[0] for m in models}
    assert set(AGENT_KINDS) == kinds - {"freeze_rank"}
    assert set(OWN_CLASSES) == {"kill_rank", "freeze_rank"}


@pytest.mark.parametrize(
    "body", [b for b in EXAMPLES if b["kind"] not in OWN_CLASSES], ids=lambda b: b["kind"]
)
def test_every_kind_plans_requests_the_agent_accepts(body: dict[str, Any]) -> None:
    spec = FAULT.validate_python(body)
    candidates = plan_requests(
        spec=spec, fault_id="exp.fault", job="job-a", agents=AGENTS, holders=["n2"]
    )
    for requests in candidates:
        for request in requests:
            agent_spec = parse_request(request.body)  # the agent's own validation
            assert agent_spec.kind == spec.kind
            assert agent_spec.ttl_seconds == spec.ttl_seconds
            assert request.agent_url.endswith(":9401")  # the fault API listener


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"kind": "kill_torchrun"}, "exactly one of 'node'"),
        ({"kind": "kill_torchrun", "node": "n0", "rank": 1}, "exactly one of 'node'"),
        ({"kind": "partition", "nodes": ["n0"], "peers": ["n0"]}, "must not share"),
        ({"kind": "link_flap", "node": "n0", "period_seconds": 1, "down_seconds": 1}, "shorter"),
        ({"kind": "trainer_fault", "rank": 0, "point": "slow_step"}, "'seconds' is required"),
        ({"kind": "trainer_fault", "rank": 0, "point": "error_at_step"}, "'step' is required"),
        ({"kind": "gpu_power_cap", "node": "n0"}, "give 'watts'"),
        ({"kind": "packet_drop", "node": "n0", "probability": 0}, "greater than 0"),
        ({"kind": "bandwidth_limit", "node": "n0", "rate_kbit": "10mbit"}, "valid integer"),
        ({"kind": "gpu_xid", "node": "n0", "xid": 79, "gpus": 1}, "Extra inputs"),
        ({"kind": "nope"}, "does not match any of the expected tags"),
    ],
)
def test_a_malformed_fault_names_the_problem(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        FAULT.validate_python(body)


def test_a_partition_is_one_request_per_node_of_side_a_naming_side_b() -> None:
    spec = FAULT.validate_python({"kind": "partition", "nodes": ["n0", "n1"], "ttl_seconds": 30})
    [requests] = plan_requests(spec=spec, fault_id="e.p", job="j", agents=AGENTS)
    assert [(r.node, r.body["id"]) for r in requests] == [("n0", "e.p:n0"), ("n1", "e.p:n1")]
    assert requests[0].body["peers"] == [{"address": "10.0.0.12", "verify_port": 9400}]
    assert spec.target_nodes() == ["n0", "n1"] and spec.target_rank() is None


def test_a_rank_fault_tries_the_node_holding_the_rank_first() -> None:
    spec = FAULT.validate_python({"kind": "cpu_throttle", "rank": 3, "cpu_fraction": 0.5})
    candidates = plan_requests(spec=spec, fault_id="e.c", job="j", agents=AGENTS, holders=["n1"])
    assert [c[0].node for c in candidates] == ["n1", "n0", "n2"]
    assert candidates[0][0].body == {
        "id": "e.c",
        "kind": "cpu_throttle",
        "rank": 3,
        "job": "j",
        "cpu_fraction": 0.5,
        "method": "auto",
        "ttl_seconds": 60.0,
    }


def test_the_rendezvous_host_is_asked_of_every_agent_and_kills_are_final() -> None:
    spec = FAULT.validate_python({"kind": "kill_rdzv_host"})
    assert len(plan_requests(spec=spec, fault_id="e.k", job="j", agents=AGENTS)) == 3
    assert "kill_rdzv_host" in FINAL_KINDS and "partition" not in FINAL_KINDS


def test_a_node_without_an_agent_is_refused_before_anything_is_sent() -> None:
    spec = FAULT.validate_python({"kind": "gpu_lost", "node": "n9"})
    with pytest.raises(FaultError, match="node 'n9' has no agent"):
        plan_requests(spec=spec, fault_id="e.g", job="j", agents=AGENTS)


def _dead_agent_fault(tmp_path: Any, restore: Any) -> Any:
    """A bound ``kill_agent`` whose agent (a closed port on loopback) no longer answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: connections are refused
    spec = FAULT.validate_python({"kind": "kill_agent", "node": "n1"})
    [[request]] = plan_requests(
        spec=spec,
        fault_id="f1",
        job="j",
        agents=[AgentEndpoint(node="n1", url=f"http://127.0.0.1:{port}")],
    )
    token = tmp_path / "token"
    token.write_text("secret")
    target = FaultTarget(job="j", node="n1", token_file=str(token), requests=(request,))

    async def revert() -> str:
        async with aiohttp.ClientSession() as session:
            return await undo_fault(
                fault_id="f1",
                spec=spec,
                target=target,
                agents=AgentClient(session, timeout=1.0),
                restore_agent=restore,
            )

    return revert


def test_reverting_a_kill_agent_asks_the_platform_and_a_lab_that_is_down_closes_it(
    tmp_path: Any,
) -> None:
    asked: list[str] = []

    def lab_down(node: str) -> None:
        asked.append(node)
        return None

    detail = asyncio.run(_dead_agent_fault(tmp_path, lab_down)())

    assert asked == ["n1"]
    assert detail == "kill_agent reverted (n1: gone with the lab)"


def test_a_platform_that_cannot_restart_the_agent_keeps_the_kill_agent_open(tmp_path: Any) -> None:
    def broken(node: str) -> str:
        raise LabError("the lab has no node 'n1' (nodes: node0)")

    with pytest.raises(FaultError, match="could not restart the agent of n1: the lab has no node"):
        asyncio.run(_dead_agent_fault(tmp_path, broken)())
