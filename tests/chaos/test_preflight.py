"""Preflight names a fault's missing rank or node before anything is injected."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import LabNotReady
from stormwatch.chaos.execution.readiness import preflight
from stormwatch.chaos.experiment.loader import parse_experiment
from stormwatch.chaos.target import AttachedJobs, Target
from stormwatch.platforms import AgentEndpoint


def _experiment(fault: str) -> str:
    return f"""
version: 1
title: preflight
job: {{name: pf, steps: 10, checkpoint_every: 5}}
steady_state_hypothesis:
  title: nothing
  probes:
    - name: progressing
      provider: {{type: job, expect: progressing, window_seconds: 1}}
method:
  - type: action
    name: fault
    fault: {fault}
rollbacks:
  - {{type: revert, name: undo}}
"""


def _target(tmp_path: Path) -> Target:
    return Target(
        run_dir=tmp_path,
        jobs=AttachedJobs(tmp_path, world_size=4),
        world_size=4,
        agents=(
            AgentEndpoint(node="node0", url="http://127.0.0.1:9"),
            AgentEndpoint(node="node1", url="http://127.0.0.1:9"),
        ),
    )


async def _preflight(text: str, target: Target) -> None:
    # The agents are asked only for kill_rank, after the rank and node checks.
    no_agents = cast(AgentClient, None)
    await preflight(parse_experiment(text), target, prometheus=None, agents=no_agents)


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ("{kind: partition, nodes: [node9], ttl_seconds: 5}", "node node9 is not in the lab"),
        ("{kind: bandwidth_limit, node: nodeX, rate_kbit: 100}", "node nodeX is not in the lab"),
        ("{kind: freeze_ranks, rank: 7}", r"rank 7 does not exist \(world size 4: ranks 0-3\)"),
    ],
)
def test_preflight_names_a_fault_target_that_is_not_in_the_lab(
    tmp_path: Path, fault: str, named: str
) -> None:
    with pytest.raises(LabNotReady, match=named):
        asyncio.run(_preflight(_experiment(fault), _target(tmp_path)))


def test_preflight_words_a_one_rank_target_in_the_singular(tmp_path: Path) -> None:
    one = Target(
        run_dir=tmp_path,
        jobs=AttachedJobs(tmp_path, world_size=1),
        world_size=1,
        agents=(AgentEndpoint(node="node0", url="http://127.0.0.1:9"),),
    )
    with pytest.raises(LabNotReady, match=r"rank 2 does not exist \(world size 1: rank 0\)$"):
        asyncio.run(_preflight(_experiment("{kind: freeze_ranks, rank: 2}"), one))
