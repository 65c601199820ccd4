"""Restarts counted per job under real torchrun: two agents on loopback (``--nnodes 2``).

torchrun's restart count is per node agent: when node A's worker fails, A counts a
restart and node B, whose worker torchrun stops only because its peer re-joined the
rendezvous, does not. Node A's worker fails in job attempt 0, node B's in attempt 1:
the node counts end 1 and 1, their max 1, after two restarts. Every rank must agree
the same job attempt (0, 1, 2) and name the node whose failure caused it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stormwatch.telemetry.events import read_events

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]

WORKLOAD = Path(__file__).with_name("attempt_workload.py")
RDZV_CONF = "join_timeout=60,last_call_timeout=1,close_timeout=10"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(node: str, out: Path, logs: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # as the lab: a fresh store per round
            "STORMWATCH_NODE": node,
            "STORMWATCH_JOB": "attempts",
            "STORMWATCH_LOG_DIR": str(logs),
            "ATTEMPT_OUT": str(out),
            "FAIL_PLAN": "0:nodeA,1:nodeB",
            "PYTHONPATH": str(WORKLOAD.parent),
        }
    )
    return env


def test_a_node_restarted_only_because_its_peer_failed_reports_the_same_job_attempt(
    tmp_path: Path,
) -> None:
    free_port = _free_port()
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    agents = {}
    for node, host in (("nodeA", 1), ("nodeB", 0)):
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "3",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port}",
            "--rdzv-id", "attempts", "--rdzv-conf", f"is_host={host},{RDZV_CONF}",
            "--local-addr", "127.0.0.1", "--monitor-interval", "0.2",
            str(WORKLOAD),
        ]  # fmt: skip
        with (tmp_path / f"{node}.log").open("w") as log:  # the child keeps its own copy
            agents[node] = subprocess.Popen(
                command, env=_env(node, out, logs), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
    try:
        codes = {node: agent.wait(timeout=240) for node, agent in agents.items()}
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                os.killpg(agent.pid, 9)
                agent.wait()
    logs_text = {n: (tmp_path / f"{n}.log").read_text(errors="replace")[-3000:] for n in agents}
    assert codes == {"nodeA": 0, "nodeB": 0}, logs_text

    seen = {p.stem: json.loads(p.read_text()) for p in out.glob("a*-*.json")}
    assert sorted(seen) == [f"a{a}-{n}" for a in range(3) for n in ("nodeA", "nodeB")], seen
    # torchrun's own counts: A counted the first restart only, B the second only.
    assert [seen[f"a{a}-nodeA"]["node_restarts"] for a in range(3)] == [0, 1, 1]
    assert [seen[f"a{a}-nodeB"]["node_restarts"] for a in range(3)] == [0, 0, 1]
    # The job's attempt is the same on both nodes, and names the node that failed.
    for node in ("nodeA", "nodeB"):
        assert [seen[f"a{a}-{node}"]["attempt"] for a in range(3)] == [0, 1, 2]
        assert [seen[f"a{a}-{node}"]["failed_nodes"] for a in range(3)] == [
            [],
            ["nodeA"],
            ["nodeB"],
        ]
    # The start records carry both counts.
    starts = [
        (e.attempt, e.job_attempt, e.restarted_by)
        for rank in (0, 1)
        for e in read_events(logs / f"rank{rank}.jsonl")
        if e.event == "start"
    ]
    assert sorted(s[1] for s in starts) == [0, 0, 1, 1, 2, 2]
    assert {(s[1], tuple(s[2] or ())) for s in starts} == {
        (0, ()),
        (1, ("nodeA",)),
        (2, ("nodeB",)),
    }
