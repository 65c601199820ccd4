"""A chaos controller that is SIGKILLed mid-injection, N times (seeded).

``python fault_controller_fork.py RUN_DIR AGENT_URL FAULT_URL TOKEN_FILE PEER_ADDR SEED N CKPT_BASE``

Rank faults target rank 0 of job ``job`` (the test runs a stand-in rank the agent
claims); checkpoint faults use ``CKPT_BASE/<i>``.

Imports the library once, then for each experiment forks a child that runs
the real injection path (:class:`stormwatch.chaos.execution.injection.injector.Injector`: ledger
row first, then the agent's fault API) for one cheap fault with a short TTL,
and SIGKILLs it after a seeded random delay: before the ledger write, between
the write and the request, while the agent answers, or after. Prints one JSON
line per experiment: ``{"i", "kind", "ttl", "delay"}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import TypeAdapter

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.execution.injection.injector import Injector
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.target import AttachedJobs, Target
from stormwatch.contracts.journal import JobRef
from stormwatch.faults import AnyExperimentFault
from stormwatch.platforms import AgentEndpoint

_FAULT: TypeAdapter[Any] = TypeAdapter(AnyExperimentFault)


def _fault(rng: random.Random, ttl: float, peer_port: int, ckpt: str) -> dict[str, Any]:
    node = {"node": "fa", "ttl_seconds": ttl}
    return rng.choice(
        [
            {"kind": "freeze_ranks", "rank": 0, "ttl_seconds": ttl},
            {"kind": "cpu_throttle", "rank": 0, "cpu_fraction": 0.5, "ttl_seconds": ttl},
            {"kind": "checkpoint_readonly", "path": ckpt, **node},
            {"kind": "partition", "nodes": ["fa"], "peers": ["fb"], "ttl_seconds": ttl},
            {"kind": "packet_drop", "probability": 0.3, **node},
            {"kind": "bandwidth_limit", "rate_kbit": 8000, **node},
            {"kind": "isolate_store", "store": f"PEER:{peer_port}", **node},
            {"kind": "gpu_throttle", "reason": "thermal", **node},
            {"kind": "nvlink_down", "links": [0], **node},
        ]
    )


async def _one(run_dir: Path, target: Target, i: int, spec: Any) -> None:
    ledger = Ledger(ledger_path(run_dir))
    async with aiohttp.ClientSession() as session:
        injector = Injector(
            ledger=ledger,
            agents=AgentClient(session),
            target=target,
            job=JobRef(name="job", log_dir=run_dir, world_size=1, started_by_runner=False),
            experiment_id=f"exp{i:02d}",
            status=lambda _: None,
            step_poll_seconds=0.1,
        )
        await injector.inject("fault", spec, recorded=lambda: None)
    time.sleep(3600)  # the experiment "runs" until the test kills it


def main(argv: list[str]) -> int:
    run_dir, agent_url, fault_url, token_file, peer, seed, count, ckpt_base = argv
    rng = random.Random(int(seed))
    peer_agent = f"http://{peer}:7000"  # B's listener stands in for its agent (verify port)
    target = Target(
        run_dir=Path(run_dir),
        jobs=AttachedJobs(Path(run_dir), world_size=1),
        world_size=1,
        agents=(
            AgentEndpoint(node="fa", url=agent_url, fault_url=fault_url),
            AgentEndpoint(node="fb", url=peer_agent, fault_url=peer_agent),
        ),
        agent_token_file=Path(token_file),
    )
    for i in range(int(count)):
        ttl = round(rng.uniform(1.0, 2.0), 2)
        ckpt = Path(ckpt_base) / str(i)
        ckpt.mkdir(parents=True, exist_ok=True)
        body = _fault(rng, ttl, 7001, str(ckpt))
        if body["kind"] == "isolate_store":
            body["store"] = f"{peer}:7001"
        spec = _FAULT.validate_python(body)
        delay = round(rng.uniform(0.0, 0.25), 3)
        pid = os.fork()
        if pid == 0:
            try:
                asyncio.run(_one(Path(run_dir), target, i, spec))
            finally:
                os._exit(0)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        print(json.dumps({"i": i, "kind": body["kind"], "ttl": ttl, "delay": delay}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
