"""Where a fault goes and how it is applied there, by its kind's placement trait.

The kind (:mod:`stormwatch.faults`) says how it is placed
(:class:`~stormwatch.faults.Placement`); this module turns that into ledger
targets (:func:`candidate_targets`, :func:`plan_requests`) and applies a fault at
its target (:func:`apply_fault`):

* ``CONTROLLER`` (``freeze_rank``): SIGSTOP of the rank's process found by its
  environment (:func:`find_rank_process`; the lab shares one PID namespace);
* ``RANK_AGENT`` (``kill_rank``): one request to the agent of the node holding the
  rank (tried in turn, holders first, until one does not answer 404);
* every other placement: one request per node agent as :func:`plan_requests` plans
  them (a partition of nodes A from nodes B is one request per node of A), recorded
  in the target before anything is sent; each agent applies its part and reverts it
  itself at the TTL, so the fault ends even if the controller is SIGKILLed. If one
  part fails, the parts already applied are reverted before raising.

Reverting is :mod:`stormwatch.chaos.ledger.undo` (from the ledger entry alone).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urlsplit

import psutil
from pydantic import BaseModel, ConfigDict

from stormwatch import faults
from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import FaultError, RankNotFound, ServiceError
from stormwatch.chaos.ledger.tokens import agent_token
from stormwatch.contracts.fault_ledger import AgentRequest, FaultTarget
from stormwatch.faults import ExperimentFault, Placement
from stormwatch.faults.kinds.orphans import describe_orphans
from stormwatch.faults.system import SIGNAL_SETTLE_S, same_process, wait_stopped
from stormwatch.platforms.endpoints import AgentEndpoint

log = logging.getLogger(__name__)


class InjectionResult(BaseModel):
    """What injecting did. Times are Unix seconds.

    Attributes:
        applied_at: when the fault took effect.
        expires_at: when it is reverted at the latest (TTL), by the agent or the reaper.
        target_pid: the process that was signalled, when known.
        detail: a short human description (``SIGKILL sent to pid 4242 on sw-node0``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    applied_at: float
    expires_at: float
    target_pid: int | None = None
    detail: str = ""


def find_rank_process(job: str, rank: int) -> psutil.Process:
    """The worker process of ``rank`` in ``job`` (topmost process with that environment).

    Raises:
        FaultError: no such process, or more than one candidate.
    """
    matches: list[psutil.Process] = []
    for process in psutil.process_iter(["pid", "ppid"]):
        try:
            env = process.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("STORMWATCH_JOB") == job and env.get("RANK") == str(rank):
            matches.append(process)
    pids = {p.pid for p in matches}
    top = [p for p in matches if p.info.get("ppid") not in pids]
    if not top:
        raise FaultError(f"no process of job {job!r} rank {rank} is running on this host")
    if len(top) > 1:
        raise FaultError(
            f"{len(top)} processes claim job {job!r} rank {rank}: {sorted(p.pid for p in top)}"
        )
    return top[0]


class _Agents:
    """The target's agents by node (a :class:`stormwatch.faults.AgentDirectory`)."""

    def __init__(self, agents: Sequence[AgentEndpoint]) -> None:
        self._by_node = {a.node: a for a in agents}

    def nodes(self) -> list[str]:
        return list(self._by_node)

    def endpoint(self, node: str) -> AgentEndpoint:
        """``node``'s agent.

        Raises:
            FaultError: the node has no agent (naming the known ones).
        """
        try:
            return self._by_node[node]
        except KeyError:
            known = ", ".join(sorted(self._by_node))
            raise FaultError(f"node {node!r} has no agent (known: {known})") from None

    def address(self, node: str) -> tuple[str, int | None]:
        parts = urlsplit(self.endpoint(node).url)
        return parts.hostname or "", parts.port


def plan_requests(
    *,
    spec: ExperimentFault,
    fault_id: str,
    job: str,
    agents: Sequence[AgentEndpoint],
    holders: Sequence[str] = (),
) -> list[list[AgentRequest]]:
    """Candidate request sets for ``spec`` (an agent-side kind), most likely first; the
    injector sends the first set no agent refuses with 404 (the rank is elsewhere; not
    the rendezvous host).

    Args:
        agents: every node's agent.
        holders: nodes whose agent lists ``spec``'s rank (tried first).

    Raises:
        FaultError: there are no agents, a node named by the fault has no agent, or the
            fault cannot be placed (a partition without peers).
    """
    directory = _Agents(agents)
    if not directory.nodes():
        raise FaultError("the target has no node agents")
    try:
        body = spec.definition.agent_body(spec, job=job, agents=directory)
    except faults.FaultError as exc:
        raise FaultError(str(exc)) from exc

    def request(node: str, agent_id: str) -> AgentRequest:
        url = directory.endpoint(node).fault_api
        return AgentRequest(node=node, agent_url=url, body={"id": agent_id, **body})

    placement = spec.traits.placement
    if placement is Placement.EACH_NODE:
        return [[request(node, f"{fault_id}:{node}") for node in spec.target_nodes()]]
    if placement is Placement.EVERY_AGENT:
        return [[request(node, fault_id)] for node in directory.nodes()]
    named = spec.target_nodes()
    if named:
        return [[request(node, fault_id)] for node in named]
    if spec.target_rank() is None:
        raise FaultError(f"{spec.kind}: the fault names neither a node nor a rank")
    ordered = sorted(directory.nodes(), key=lambda n: n not in holders)
    return [[request(n, fault_id)] for n in ordered]


def local_target(spec: ExperimentFault, job: str) -> FaultTarget:
    """The target of a controller-side fault: the rank's process (pid and start time).

    Raises:
        FaultError: the process cannot be found (see :func:`find_rank_process`).
    """
    rank = spec.target_rank()
    assert rank is not None  # Target.RANK
    process = find_rank_process(job, rank)
    return FaultTarget(job=job, rank=rank, pid=process.pid, pid_create_time=process.create_time())


def agent_targets(
    *,
    spec: ExperimentFault,
    fault_id: str,
    job: str,
    agents: Sequence[AgentEndpoint],
    token_file: str | None,
    holders: Sequence[str] = (),
) -> list[FaultTarget]:
    """Where an agent-side fault can go, most likely first (``holders`` lead).

    Raises:
        FaultError: as :func:`plan_requests`.
    """
    rank = spec.target_rank()
    if spec.traits.placement is Placement.RANK_AGENT:
        if not agents:
            raise FaultError("the target has no node agents")
        ordered = sorted(agents, key=lambda a: a.node not in holders)
        return [
            FaultTarget(
                job=job, rank=rank, node=a.node, agent_url=a.fault_api, token_file=token_file
            )
            for a in ordered
        ]
    sets = plan_requests(spec=spec, fault_id=fault_id, job=job, agents=agents, holders=holders)
    return [
        FaultTarget(
            job=job,
            rank=rank,
            node=requests[0].node if len(requests) == 1 else None,
            agent_url=requests[0].agent_url if len(requests) == 1 else None,
            token_file=token_file,
            requests=tuple(requests),
        )
        for requests in sets
    ]


async def apply_fault(
    *, fault_id: str, spec: ExperimentFault, target: FaultTarget, agents: AgentClient
) -> InjectionResult:
    """Apply ``spec`` at ``target`` (the same ``fault_id`` twice has one effect).

    Raises:
        RankNotFound: the (first) agent answered 404: nothing was applied there.
        FaultError: refused, unreachable, or the target lacks what the kind needs.
    """
    apply = _APPLY.get(spec.traits.placement, _send_parts)
    return await apply(fault_id, spec, target, agents)


async def _sigstop(
    fault_id: str, spec: ExperimentFault, target: FaultTarget, agents: AgentClient
) -> InjectionResult:
    if target.pid is None or target.pid_create_time is None:
        raise FaultError(f"fault {fault_id}: {spec.kind} needs the target pid and start time")
    process = same_process((target.pid, target.pid_create_time))
    if process is None:
        raise FaultError(f"fault {fault_id}: rank process {target.pid} is gone")
    try:
        process.send_signal(signal.SIGSTOP)
    except psutil.Error as exc:
        raise FaultError(f"fault {fault_id}: SIGSTOP {target.pid}: {exc}") from exc
    # the signal is asynchronous: answer once the process is seen stopped, as the agent does
    late = await asyncio.to_thread(wait_stopped, [process])
    now = time.time()
    detail = f"SIGSTOP to rank {spec.target_rank()} (pid {target.pid})"
    if late:  # in uninterruptible sleep (I/O): it stops when its call returns
        detail += f", not seen stopped within {SIGNAL_SETTLE_S:g} s"
    return InjectionResult(
        applied_at=now, expires_at=now + spec.ttl_seconds, target_pid=target.pid, detail=detail
    )


async def _send_one(
    fault_id: str, spec: ExperimentFault, target: FaultTarget, agents: AgentClient
) -> InjectionResult:
    """``kill_rank``: ask the agent of ``target.node`` to signal the rank."""
    if target.agent_url is None or target.token_file is None:
        raise FaultError(f"fault {fault_id}: {spec.kind} needs the agent URL and token file")
    body = {"id": fault_id, **spec.definition.agent_body(spec, job=target.job, agents=_Agents(()))}
    try:
        answer = await agents.inject(target.agent_url, agent_token(target, fault_id), body)
    except ServiceError as exc:
        raise FaultError(f"fault {fault_id}: {exc}") from exc
    pid = f" (pid {answer.target_pid})" if answer.target_pid else ""
    return InjectionResult(
        applied_at=answer.applied_at if answer.applied_at is not None else time.time(),
        expires_at=answer.expires_at,
        target_pid=answer.target_pid,
        detail=f"{body['signal']} to rank {spec.target_rank()}{pid} on {target.node}",
    )


async def _send_parts(
    fault_id: str, spec: ExperimentFault, target: FaultTarget, agents: AgentClient
) -> InjectionResult:
    """Send every request of ``target``; on a failure revert the parts already applied."""
    if not target.requests or target.token_file is None:
        raise FaultError(f"fault {fault_id}: {spec.kind} needs agent requests and a token file")
    token = agent_token(target, fault_id)
    applied: list[AgentRequest] = []
    answers = []
    for part in target.requests:
        try:
            answers.append(await agents.inject(part.agent_url, token, part.body))
        except (RankNotFound, FaultError, ServiceError) as exc:
            for done in applied:
                try:
                    await agents.revert_fault(done.agent_url, token, str(done.body["id"]))
                except (FaultError, ServiceError) as undo:
                    # the agent reverts it at its TTL; the ledger row stays open
                    log.warning(
                        "fault %s: part on %s not reverted (its agent does at the TTL): %s",
                        fault_id,
                        done.node,
                        undo,
                    )
            if isinstance(exc, RankNotFound) and not applied:
                raise
            raise FaultError(f"fault {fault_id} on {part.node}: {exc}") from exc
        applied.append(part)
    now = time.time()
    nodes = ", ".join(p.node for p in target.requests)
    # What a kill left running (kill_torchrun's orphaned ranks), per node, for the journal.
    left = [
        f"{part.node}: {said}"
        for part, answer in zip(target.requests, answers, strict=True)
        if (said := describe_orphans(answer.details))
    ]
    return InjectionResult(
        applied_at=min((a.applied_at for a in answers if a.applied_at is not None), default=now),
        expires_at=max(a.expires_at for a in answers),
        target_pid=answers[0].target_pid,
        detail=f"{spec.kind} applied by the agent(s) of {nodes}" + "".join(f"; {x}" for x in left),
    )


_Apply = Callable[[str, ExperimentFault, FaultTarget, AgentClient], Awaitable[InjectionResult]]
#: How each placement is applied (the rest: :func:`_send_parts`).
_APPLY: dict[Placement, _Apply] = {
    Placement.CONTROLLER: _sigstop,
    Placement.RANK_AGENT: _send_one,
}

__all__ = [
    "InjectionResult",
    "agent_targets",
    "apply_fault",
    "find_rank_process",
    "local_target",
    "plan_requests",
]
