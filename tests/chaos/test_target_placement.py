"""Fault targeting asks the platform backend where a rank runs before asking every agent.

The backend is the real Slurm backend with its command runner recorded (no Slurm
here); the agents are real HTTP clients pointed at closed ports, so only the
backend can put the right node first.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.execution.injection.injector import Injector
from stormwatch.chaos.target import AttachedJobs, Target
from stormwatch.contracts.journal import JobRef
from stormwatch.faults import REGISTRY
from stormwatch.platforms import AgentEndpoint
from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _slurm(running: bool) -> SlurmBackend:
    def run(argv: Sequence[str]) -> str:
        if argv[0] == "squeue":
            return "9|n[1-2]\n" if running else ""
        return "n1\nn2\n"

    return SlurmBackend(
        diagnostics_dir=Path("/nonexistent"), nproc_per_node=2, commands=SlurmCommands(runner=run)
    )


def _located_nodes(tmp_path: Path, backend: SlurmBackend, rank: int) -> list[str | None]:
    agents = tuple(
        AgentEndpoint(node=n, url=f"http://127.0.0.1:{_closed_port()}") for n in ("n1", "n2")
    )
    target = Target(
        run_dir=tmp_path,
        jobs=AttachedJobs(tmp_path, world_size=4),
        world_size=4,
        agents=agents,
        placement=backend,
    )
    job = JobRef(name="llm", log_dir=tmp_path, world_size=4, started_by_runner=False)

    async def locate() -> list[str | None]:
        async with aiohttp.ClientSession() as session:
            injector = Injector(
                ledger=None,  # type: ignore[arg-type]  # locate() never records
                agents=AgentClient(session, timeout=2.0),
                target=target,
                job=job,
                experiment_id="e",
                status=lambda _: None,
                step_poll_seconds=0.1,
            )
            fault = REGISTRY["kill_rank"].experiment(kind="kill_rank", rank=rank)
            return [t.node for t in await injector.locate(fault)]

    return asyncio.run(locate())


def test_the_node_the_backend_places_the_rank_on_comes_first(tmp_path: Path) -> None:
    assert _located_nodes(tmp_path, _slurm(running=True), rank=3) == ["n2", "n1"]
    assert _located_nodes(tmp_path, _slurm(running=True), rank=0) == ["n1", "n2"]


def test_a_backend_that_does_not_know_the_job_leaves_the_agents_order(tmp_path: Path) -> None:
    assert _located_nodes(tmp_path, _slurm(running=False), rank=3) == ["n1", "n2"]
