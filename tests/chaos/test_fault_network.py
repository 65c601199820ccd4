"""Network and link faults applied by a real agent inside its node's namespace, effect observed.

Two namespaces on a bridge (``fault_netns.FaultNet``); the agent runs in A; B
serves TCP. Each test injects through the fault API, observes the effect from
inside A (a TCP connect, a transfer's rate, UDP loss, the link state), reverts
and checks the effect is gone and nothing is left (iptables chains, qdisc).
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import aiohttp
import pytest

from stormwatch.chaos.clients.agent import AgentClient

pytestmark = pytest.mark.root


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fault_netns = _load("fault_netns")
PEER, OTHER = fault_netns.TCP_PORTS


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    lab = fault_netns.FaultNet(tmp_path_factory.mktemp("faultnet")).up()
    try:
        yield lab
    finally:
        lab.down()


def _partition(fault_id: str, net: object, **extra: object) -> dict[str, object]:
    return {
        "id": fault_id,
        "kind": "partition",
        "peers": [{"address": net.addr_b, "verify_port": PEER}],  # type: ignore[attr-defined]
        "ttl_seconds": 60,
        **extra,
    }


def test_partition_blocks_the_peer_until_reverted_then_connects_again(net) -> None:
    assert net.a_connects(net.addr_b, PEER)
    record = net.inject(_partition("part-1", net))
    assert record["state"] == "applied"
    assert not net.a_connects(net.addr_b, PEER)
    status, answer = net.revert("part-1")
    assert status == 200 and answer["state"] == "reverted", answer
    assert net.a_connects(net.addr_b, PEER)
    assert net.rules() == []


def test_double_inject_then_one_revert_leaves_no_rule(net) -> None:
    body = _partition("part-twice", net, direction="outbound")
    first = net.inject(body)
    again = net.inject(body)
    assert again == first  # the same id again: one effect, the first record
    jumps = [r for r in net.rules() if r.startswith(("-A INPUT", "-A OUTPUT"))]
    assert len(jumps) == 2, jumps  # one jump per hook, not four
    assert net.revert("part-twice")[0] == 200
    assert net.rules() == []
    assert net.revert("part-twice")[1]["state"] == "reverted"  # idempotent


def test_partition_revert_fails_loudly_when_the_peer_stays_unreachable(net) -> None:
    body = _partition("part-verify", net)
    body["peers"] = [{"address": net.addr_b, "verify_port": 7999}]  # nothing listens there
    body["verify_timeout_seconds"] = 0.5
    net.inject(body)
    status, answer = net.revert("part-verify")
    assert status == 500 and "unreachable" in answer["error"], answer
    assert net.record("part-verify")["state"] == "applied"  # still open: retried at the TTL
    assert net.rules() == []  # the rules themselves are gone
    net.request("DELETE", f"{net.fault_url}/v1/faults/part-verify")


def test_isolate_store_drops_only_the_store_port(net) -> None:
    net.inject(
        {
            "id": "store-1",
            "kind": "isolate_store",
            "store": f"{net.addr_b}:{PEER}",
            "ttl_seconds": 60,
        }
    )
    assert not net.a_connects(net.addr_b, PEER)
    assert net.a_connects(net.addr_b, OTHER)  # the data path to the same host still works
    assert net.revert("store-1")[0] == 200
    assert net.a_connects(net.addr_b, PEER)
    assert net.rules() == []


def test_packet_drop_loses_packets_and_revert_restores_delivery(net) -> None:
    echo = (net.addr_a, str(fault_netns.UDP_PORT))
    before = int(net.probe(net.ns_b, "udp-loss", *echo, "40").stdout)
    # only with B: a node-wide drop would also cut the test's own fault API traffic
    net.inject(
        {
            "id": "drop-1",
            "kind": "packet_drop",
            "probability": 0.5,
            "peers": [net.addr_b],
            "ttl_seconds": 60,
        }
    )
    during = int(net.probe(net.ns_b, "udp-loss", *echo, "40").stdout)
    assert net.revert("drop-1")[0] == 200
    after = int(net.probe(net.ns_b, "udp-loss", *echo, "40").stdout)
    # each echo crosses the drop twice: ~25 % come back (P(>= 30 of 40) < 1e-9)
    assert before == 40 and during < 30 and after == 40, (before, during, after)
    assert net.rules() == []


def test_bandwidth_limit_caps_a_transfer_and_revert_removes_the_qdisc(net) -> None:
    rate_kbit = 2000  # 250 kB/s
    net.inject(
        {"id": "tbf-1", "kind": "bandwidth_limit", "rate_kbit": rate_kbit, "ttl_seconds": 60}
    )
    net.inject(
        {"id": "tbf-1", "kind": "bandwidth_limit", "rate_kbit": rate_kbit, "ttl_seconds": 60}
    )
    assert net.qdisc().count("tbf") == 1
    limited = float(net.probe(net.ns_a, "send", net.addr_b, str(PEER), "400000").stdout)
    assert net.revert("tbf-1")[0] == 200
    assert "tbf" not in net.qdisc()
    free = float(net.probe(net.ns_a, "send", net.addr_b, str(PEER), "400000").stdout)
    # 400 kB through a 250 kB/s bucket (32 kB burst) cannot beat 1.5x the rate;
    # over the bare veth it is far faster.
    assert limited < 1.5 * rate_kbit * 1000 / 8, limited
    assert free > 3 * limited, (free, limited)


def test_link_flap_takes_the_link_down_and_ends_up_with_routes(net) -> None:
    states: list[bool] = []

    def watch() -> None:  # from the root namespace: the API itself goes through the link
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            states.append(net.link_up())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    net.inject(
        {
            "id": "flap-1",
            "kind": "link_flap",
            "period_seconds": 0.6,
            "down_seconds": 0.3,
            "ttl_seconds": 2,
        }
    )
    watcher.join()
    assert False in states and True in states
    deadline = time.monotonic() + 10
    while net.record("flap-1")["state"] != "reverted":
        assert time.monotonic() < deadline, net.record("flap-1")
        time.sleep(0.2)
    assert net.record("flap-1")["revert_reason"] == "ttl"
    assert net.link_up() and net.default_route()
    assert net.a_connects(net.addr_b, PEER)


def test_a_long_link_cut_answers_the_inject_before_the_link_goes_down(net) -> None:
    # The API is reached over the link it cuts: answered first, then down for 3 s, once.
    asked = time.monotonic()
    record = net.inject(
        {
            "id": "cut-1",
            "kind": "link_flap",
            "period_seconds": 3600,
            "down_seconds": 3,
            "ttl_seconds": 10,
        }
    )
    answered = time.monotonic()
    assert record["state"] == "applied" and answered - asked < 0.5, answered - asked
    deadline = time.monotonic() + 2
    while net.link_up():
        assert time.monotonic() < deadline, "the link never went down"
        time.sleep(0.02)
    assert not net.a_connects(net.addr_b, PEER)
    time.sleep(3.5)
    assert net.link_up() and net.default_route()  # healed by the agent's thread at 3 s
    assert net.a_connects(net.addr_b, PEER)
    assert net.revert("cut-1")[0] == 200


def test_an_agent_killed_with_a_partition_applied_reverts_it_when_restarted(net) -> None:
    net.inject(_partition("part-crash", net, ttl_seconds=1.5))
    net.kill_agent()
    assert net.rules() != []  # nobody left to revert it...
    assert not net.a_connects(net.addr_b, PEER)
    time.sleep(1.5)
    net.start_agent()  # ...until the agent starts again and reads its ledger
    record = net.record("part-crash")
    assert record["state"] == "reverted" and record["revert_reason"] == "ttl", record
    assert net.rules() == []
    assert net.a_connects(net.addr_b, PEER)


def test_kill_agent_answers_then_the_agent_dies(net) -> None:
    record = net.inject({"id": "kill-agent-1", "kind": "kill_agent", "delay_seconds": 0.3})
    assert record["state"] == "applied"
    net.agent.wait(10)
    assert net.request("GET", f"{net.agent_url}/healthz")[0] == 0  # nobody answers
    net.start_agent()
    assert net.record("kill-agent-1")["kind"] == "kill_agent"


def test_the_controller_revert_of_a_partition_fails_loudly_and_keeps_it_open(
    net, tmp_path: Path
) -> None:
    """Through the controller's own classes: ledger first, agent API, revert, FC-13."""
    from pydantic import TypeAdapter

    from stormwatch.chaos.execution.injection.placement import apply_fault, plan_requests
    from stormwatch.chaos.ledger.ledger import Ledger
    from stormwatch.chaos.ledger.revert import revert_open
    from stormwatch.contracts.fault_ledger import FaultTarget
    from stormwatch.faults import AnyExperimentFault
    from stormwatch.platforms import AgentEndpoint

    agents = (
        AgentEndpoint(node="fa", url=net.agent_url, fault_url=net.fault_url),
        AgentEndpoint(node="fb", url=f"http://{net.addr_b}:7999"),  # its "agent" is down
    )
    spec = TypeAdapter(AnyExperimentFault).validate_python(
        {"kind": "partition", "nodes": ["fa"], "verify_timeout_seconds": 0.5, "ttl_seconds": 60}
    )
    [requests] = plan_requests(spec=spec, fault_id="exp.part", job="j", agents=agents)
    target = FaultTarget(job="j", token_file=str(net.token_file), requests=tuple(requests))
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ledger.record(
        fault_id="exp.part",
        experiment_id="exp",
        spec=spec,
        target=target,
        expires_at=time.time() + 60,
    )

    async def inject() -> None:
        async with aiohttp.ClientSession() as session:
            result = await apply_fault(
                fault_id="exp.part", spec=spec, target=target, agents=AgentClient(session)
            )
            ledger.mark_injected(
                "exp.part",
                injected_at=result.applied_at,
                expires_at=result.expires_at,
                target_pid=None,
            )

    asyncio.run(inject())
    assert not net.a_connects(net.addr_b, PEER)
    [outcome] = asyncio.run(revert_open(ledger, reason="revert --all"))
    assert not outcome.ok and "still unreachable" in outcome.detail, outcome
    assert ledger.get("exp.part").open  # loud, and still open for the next revert
    assert net.rules() == [] and net.a_connects(net.addr_b, PEER)  # the rules did go
    net.request("DELETE", f"{net.fault_url}/v1/faults/exp.part:fa")


LAUNCHER = """
import os, signal, subprocess, sys, time
# the test stops it with SIGTERM: exit through `finally`, or its rank outlives the test
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
job, metrics = sys.argv[-2], sys.argv[-1]
env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TORCHELASTIC_RUN_ID=job,
           STORMWATCH_JOB=job, STORMWATCH_METRICS_DIR=metrics)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
try:
    time.sleep(600)
finally:
    child.kill()
"""


@pytest.mark.parametrize("form", ["rdzv-endpoint", "master-addr"])
def test_isolate_store_defaults_to_the_jobs_rendezvous_endpoint(
    net, tmp_path: Path, form: str
) -> None:
    """The job's store, as its torchrun names it: ``--rdzv-endpoint`` (c10d rendezvous) or
    ``--master-addr``/``--master-port`` (static rendezvous), like the agent's store probe."""
    script = tmp_path / "bin" / "torchrun"  # the agent recognises torchrun by name
    script.parent.mkdir()
    script.write_text(LAUNCHER)
    endpoint = f"{net.addr_b}:{PEER}"
    names = (
        ["--rdzv-endpoint", endpoint]
        if form == "rdzv-endpoint"
        else ["--master-addr", net.addr_b, "--master-port", str(PEER)]
    )
    launcher = subprocess.Popen(
        [sys.executable, str(script), *names, "job-rdzv", str(net.metrics_dir)]
    )
    try:
        body = {
            "id": f"store-default-{form}",
            "kind": "isolate_store",
            "job": "job-rdzv",
            "ttl_seconds": 60,
        }
        deadline = time.monotonic() + 15
        while (reply := net.request("POST", f"{net.fault_url}/v1/faults", body))[0] == 404:
            assert time.monotonic() < deadline, reply  # until the rank watcher has seen it
            time.sleep(0.2)
        assert reply[0] == 201 and reply[1]["details"]["store"] == endpoint, reply
        assert not net.a_connects(net.addr_b, PEER)
        assert net.a_connects(net.addr_b, OTHER)
        assert net.revert(f"store-default-{form}")[0] == 200
        assert net.a_connects(net.addr_b, PEER) and net.rules() == []
    finally:
        launcher.terminate()
        launcher.wait(10)
