"""Faults the node agents apply: every catalogue kind except ``kill_rank`` and ``freeze_rank``.

The controller turns an experiment's fault into one request per node agent
(:func:`plan_requests`; a partition of nodes A from nodes B is one request
per node of A), records them in the ledger's target, then ``POST``s them.
Each agent applies its part locally and reverts it itself at the TTL, so the
fault ends even if the controller is SIGKILLed. Revert ``DELETE``s every part
and checks that each agent reports it ``reverted``; an agent that answers
that its revert failed (rules still present, a peer still unreachable) makes
the revert fail loudly (FC-13) and the fault stays open in the ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import FaultError, RankNotFound, ServiceError
from stormwatch.chaos.faults.base import AgentRequest, FaultTarget, InjectionResult
from stormwatch.chaos.faults.specs import (
    FINAL_KINDS,
    Fault,
    KillRdzvHostFault,
    PacketDropFault,
    PartitionFault,
    target_rank,
)
from stormwatch.errors import StormwatchError

#: Agent-side kinds whose request takes the job's name (the agent picks that job's ranks).
JOB_KINDS = frozenset(
    {
        "kill_torchrun",
        "kill_node_processes",
        "kill_rdzv_host",
        "freeze_ranks",
        "isolate_store",
        "cpu_throttle",
        "trainer_fault",
        "checkpoint_readonly",
        "checkpoint_full",
    }
)
#: How long revert keeps trying an agent it cannot reach (a flapping link comes back), seconds.
UNREACHABLE_RETRY_S = 6.0
#: How long reverting a ``kill_agent`` waits for the agent to answer again, seconds (a
#: DaemonSet's first restart back-off is 10 s; the lab restarts it at once).
AGENT_BACK_TIMEOUT_S = 90.0
#: The agent kills itself this long after answering the inject (its ``delay_seconds``
#: default, 0.5 s, plus a margin): a revert probes it only after that.
KILL_AGENT_SETTLE_S = 1.5


def _address(url: str) -> tuple[str, int | None]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port


def plan_requests(
    *,
    spec: Fault,
    fault_id: str,
    job: str,
    agents: Sequence[Any],
    holders: Sequence[str] = (),
) -> list[list[AgentRequest]]:
    """Candidate request sets for ``spec``, most likely first; the injector sends the first
    set no agent refuses with 404 (the rank is elsewhere; not the rendezvous host).

    Args:
        agents: every node's agent (``node``, ``url``).
        holders: nodes whose agent lists ``spec``'s rank (tried first).

    Raises:
        FaultError: a node named by the fault has no agent.
    """
    by_node = {a.node: a for a in agents}
    if not by_node:
        raise FaultError("the target has no node agents")
    body = spec.agent_body()
    if spec.kind in JOB_KINDS:
        body["job"] = job
    if isinstance(spec, PacketDropFault) and spec.peers is not None:
        body["peers"] = [_address(_agent(by_node, n).url)[0] for n in spec.peers]

    def request(node: str, agent_id: str, extra: dict[str, Any] | None = None) -> AgentRequest:
        agent = _agent(by_node, node)
        return AgentRequest(
            node=node, agent_url=agent.fault_api, body={"id": agent_id, **body, **(extra or {})}
        )

    if isinstance(spec, PartitionFault):
        peers = (
            spec.peers if spec.peers is not None else [n for n in by_node if n not in spec.nodes]
        )
        if not peers:
            raise FaultError("partition: no peer nodes (every node is in 'nodes')")
        peer_list = []
        for name in peers:
            address, port = _address(_agent(by_node, name).url)
            peer_list.append({"address": address, "verify_port": port})
        return [[request(node, f"{fault_id}:{node}", {"peers": peer_list}) for node in spec.nodes]]
    if isinstance(spec, KillRdzvHostFault):
        return [[request(node, fault_id)] for node in by_node]
    node = getattr(spec, "node", None)
    if isinstance(node, str):
        return [[request(node, fault_id)]]
    if target_rank(spec) is None:
        raise FaultError(f"{spec.kind}: the fault names neither a node nor a rank")
    ordered = sorted(by_node, key=lambda n: n not in holders)
    return [[request(n, fault_id)] for n in ordered]


def _agent(by_node: dict[str, Any], node: str) -> Any:
    try:
        return by_node[node]
    except KeyError:
        raise FaultError(
            f"node {node!r} has no agent (known: {', '.join(sorted(by_node))})"
        ) from None


class AgentSideFault:
    """A catalogue fault bound to its id and its agent requests (``target.requests``).

    Args:
        fault_id: the ledger id.
        spec: the fault from the experiment.
        target: must carry ``requests`` and ``token_file``.
        agents: HTTP client.
        expires_at: the ledger's expiry (Unix s): a final kind (a kill) whose agent is
            unreachable after it counts as closed.
        injected_at: when it was applied (Unix s; ``kill_agent`` waits for the kill to land
            before checking the agent).
        restore_agent: ``restore_agent(node)`` starts a dead agent again through the platform
            and says what it did (the lab restarts its service), or returns None when the
            platform itself is gone (a lab brought down); None: the platform's own
            supervisor (DaemonSet, systemd) is waited for.
    """

    reverts_itself = True

    def __init__(
        self,
        *,
        fault_id: str,
        spec: Fault,
        target: FaultTarget,
        agents: AgentClient,
        expires_at: float | None = None,
        injected_at: float | None = None,
        restore_agent: Callable[[str], str | None] | None = None,
    ) -> None:
        if not target.requests or target.token_file is None:
            raise FaultError(f"fault {fault_id}: {spec.kind} needs agent requests and a token file")
        self.fault_id = fault_id
        self.spec = spec
        self.target = target
        self._agents = agents
        self._expires_at = expires_at
        self._injected_at = injected_at
        self._restore_agent = restore_agent

    async def inject(self) -> InjectionResult:
        """Send every request (the same ids again have one effect).

        If one fails, the parts already applied are reverted before raising.

        Raises:
            RankNotFound: the (first) agent answered 404: nothing was applied there.
            FaultError: refused or unreachable.
        """
        token = self._token()
        applied: list[AgentRequest] = []
        answers = []
        for part in self.target.requests:
            try:
                answers.append(await self._agents.inject(part.agent_url, token, part.body))
            except (RankNotFound, FaultError, ServiceError) as exc:
                for done in applied:
                    # on failure the agent reverts it at its TTL; the ledger row stays open
                    with contextlib.suppress(FaultError, ServiceError):
                        await self._agents.revert_fault(done.agent_url, token, done.body["id"])
                if isinstance(exc, RankNotFound) and not applied:
                    raise
                raise FaultError(f"fault {self.fault_id} on {part.node}: {exc}") from exc
            applied.append(part)
        now = time.time()
        nodes = ", ".join(p.node for p in self.target.requests)
        return InjectionResult(
            applied_at=min(
                (a.applied_at for a in answers if a.applied_at is not None), default=now
            ),
            expires_at=max(a.expires_at for a in answers),
            target_pid=answers[0].target_pid,
            detail=f"{self.spec.kind} applied by the agent(s) of {nodes}",
        )

    async def revert(self) -> str:
        """``DELETE`` every part and check each agent reports it reverted.

        Raises:
            FaultError: an agent failed to revert (its message), reports the fault still
                active, or cannot be reached (a non-final fault stays open; the agent still
                reverts it at its TTL).
        """
        token = self._token()
        if self.spec.kind == "kill_agent":
            return await self._revive_agents(token)
        done = []
        for part in self.target.requests:
            agent_id = str(part.body["id"])
            record = await self._revert_part(part, token, agent_id)
            if record is None:
                done.append(f"{part.node}: not held")
            elif record.get("state") in ("reverted", "failed"):
                done.append(f"{part.node}: {record.get('state')}")
            elif record.get("state") is not None:
                raise FaultError(
                    f"fault {self.fault_id}: agent {part.node} still reports it "
                    f"{record.get('state')} ({record.get('error')})"
                )
            else:
                done.append(f"{part.node}: closed")
        return f"{self.spec.kind} reverted ({'; '.join(done)})"

    async def _revive_agents(self, token: str) -> str:
        """Revert of ``kill_agent``: the agent runs and answers again (restarted through the
        platform when ``restore_agent`` is given), then its record of the kill is closed.

        Raises:
            FaultError: an agent still does not answer after ``AGENT_BACK_TIMEOUT_S``.
        """
        if self._injected_at is not None:
            await asyncio.sleep(max(0.0, self._injected_at + KILL_AGENT_SETTLE_S - time.time()))
        done = []
        for part in self.target.requests:
            agent_id = str(part.body["id"])
            how = "answering"
            try:
                await self._agents.revert_fault(part.agent_url, token, agent_id)
                done.append(f"{part.node}: agent {how}")
                continue
            except ServiceError:
                pass
            if self._restore_agent is not None:
                try:
                    restored = await asyncio.to_thread(self._restore_agent, part.node)
                except StormwatchError as exc:
                    raise FaultError(
                        f"fault {self.fault_id}: could not restart the agent of {part.node}: {exc}"
                    ) from exc
                if restored is None:  # the whole platform (the lab) is down: nothing to restore
                    done.append(f"{part.node}: gone with the lab")
                    continue
                how = restored
            deadline = time.monotonic() + AGENT_BACK_TIMEOUT_S
            while True:
                try:
                    await self._agents.revert_fault(part.agent_url, token, agent_id)
                    break
                except ServiceError as exc:
                    if time.monotonic() >= deadline:
                        raise FaultError(
                            f"fault {self.fault_id}: the agent of {part.node} still does not "
                            f"answer {AGENT_BACK_TIMEOUT_S:.0f} s into the revert ({exc}); start "
                            "it again (lab: `stormwatch lab up --run-dir RUN` restarts dead "
                            "agents; Kubernetes: the DaemonSet pod; Slurm: the agent's unit), "
                            "then `stormwatch chaos revert --all`"
                        ) from exc
                    await asyncio.sleep(0.5)
            done.append(f"{part.node}: agent {how}")
        return f"kill_agent reverted ({'; '.join(done)})"

    async def _revert_part(
        self, part: AgentRequest, token: str, agent_id: str
    ) -> dict[str, Any] | None:
        deadline = time.monotonic() + UNREACHABLE_RETRY_S
        while True:
            try:
                return await self._agents.revert_fault(part.agent_url, token, agent_id)
            except ServiceError as exc:
                if self.spec.kind in FINAL_KINDS:
                    return {"state": None}  # a kill (or a dead agent): nothing left to undo
                if time.monotonic() >= deadline:
                    raise FaultError(
                        f"fault {self.fault_id}: cannot reach the agent of {part.node} to "
                        f"revert it: {exc} (the agent reverts it at its TTL)"
                    ) from exc
                await asyncio.sleep(0.5)

    def _token(self) -> str:
        assert self.target.token_file is not None
        try:
            return Path(self.target.token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise FaultError(
                f"fault {self.fault_id}: cannot read the agent token {self.target.token_file}: "
                f"{exc.strerror}"
            ) from exc


__all__ = ["JOB_KINDS", "AgentSideFault", "plan_requests"]
