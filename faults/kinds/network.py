"""Network faults made of iptables rules in the node's own network namespace.

The agent runs inside its node's namespace (the lab: ``sw-nodeN``; a real
node: the host), so the rules act on that node only. Each fault owns two
chains named from its id, ``SWI-<tag>`` (jumped to from ``INPUT``) and
``SWO-<tag>`` (from ``OUTPUT``): injecting again flushes and refills them and
adds a jump only when missing (one effect), and revert removes exactly the
jumps and chains it added, then checks ``iptables -S`` no longer mentions the
tag (FC-13: it fails loudly otherwise).

What each models in production:

* ``partition``: a switch or routing failure that splits the cluster, e.g.
  one rack unreachable from the others (``both``), or a one-way failure
  (``outbound``: this node's packets to the peers are dropped; ``inbound``: the
  peers' packets to it). Revert also checks this node can open a TCP
  connection to every peer's ``verify_port`` (their agent) again.
* ``isolate_store``: the node cannot reach the rendezvous (c10d) store, while
  the data path between ranks still works: a firewall change or a store host
  overload seen from one node.
* ``packet_drop``: random loss of ``probability`` of the node's packets (in and
  out, optionally only with ``peers``): a flaky cable, optic or switch port.
  Loopback is never touched.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stormwatch.faults.base import Fault, FaultRequest, Injection
from stormwatch.faults.errors import FaultError, FaultTargetNotFound
from stormwatch.faults.kind import DetectClass, FaultKind, Placement, Target, Traits
from stormwatch.faults.limits import JobName, NodeName
from stormwatch.faults.node import FaultContext
from stormwatch.faults.system import (
    job_ranks,
    run,
    short_tag,
    store_endpoint,
    torchruns,
    wait_until,
)
from stormwatch.faults.targeting import AgentDirectory, NodeOrRank, NodeSets

log = logging.getLogger(__name__)

#: How long a partition's revert tries to reach each peer again, seconds.
VERIFY_TIMEOUT_S = 5.0
_IPT = ("iptables", "-w", "10")


def _network(value: str) -> str:
    try:
        return str(ipaddress.IPv4Network(value, strict=False))
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an IPv4 address or CIDR") from exc


class Peer(BaseModel):
    """One peer of a partition: ``address`` (IPv4 or CIDR), ``verify_port`` (its agent's port)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    address: str
    verify_port: int | None = Field(default=None, ge=1, le=65_535)

    @field_validator("address")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        _network(value)
        return value


class PartitionRequest(FaultRequest):
    """``partition``: ``peers`` (the other side), ``direction`` (``both``),
    ``verify_timeout_seconds`` (how long revert tries each peer's ``verify_port``)."""

    kind: Literal["partition"]
    peers: list[Peer] = Field(min_length=1, max_length=1024)
    direction: Literal["both", "outbound", "inbound"] = "both"
    verify_timeout_seconds: float = Field(default=VERIFY_TIMEOUT_S, gt=0, le=300)


class IsolateStoreRequest(FaultRequest):
    """``isolate_store``: ``store`` ``host:port`` (default: the job's torchrun's store,
    :func:`~stormwatch.faults.system.store_endpoint`)."""

    kind: Literal["isolate_store"]
    store: str | None = Field(default=None, pattern=r"^[^:\s]+:[0-9]{1,5}$")
    job: JobName | None = None


class PacketDropRequest(FaultRequest):
    """``packet_drop``: ``probability`` (0, 1], ``peers`` (addresses/CIDRs; default: all)."""

    kind: Literal["packet_drop"]
    probability: float = Field(gt=0, le=1)
    peers: list[str] | None = Field(default=None, min_length=1, max_length=1024)

    @field_validator("peers")
    @classmethod
    def _ipv4(cls, value: list[str] | None) -> list[str] | None:
        for peer in value or []:
            _network(peer)
        return value


class NodeOrRankPeers(NodeOrRank):
    """``node`` or ``rank``, and ``peers``: node names whose traffic alone is affected
    (default: all; listed where the request's ``peers`` is); the agent gets their agents'
    addresses."""

    supplies: ClassVar[frozenset[str]] = frozenset({"peers"})
    in_place: ClassVar[dict[str, tuple[Any, Any]]] = {"peers": (list[NodeName] | None, None)}

    if TYPE_CHECKING:
        peers: list[str] | None

    def targeting_fields(self, agents: AgentDirectory) -> dict[str, Any]:
        if self.peers is None:
            return {}
        return {"peers": [agents.address(name)[0] for name in self.peers]}


class Chains:
    """The two iptables chains of one fault (``SWI-<tag>``, ``SWO-<tag>``)."""

    def __init__(self, fault_id: str) -> None:
        self.tag = short_tag(fault_id)
        self.input, self.output = f"SWI-{self.tag}", f"SWO-{self.tag}"

    def install(self, input_rules: list[list[str]], output_rules: list[list[str]]) -> None:
        """(Re)fill both chains and hook them once (idempotent)."""
        for chain, hook, rules in (
            (self.input, "INPUT", input_rules),
            (self.output, "OUTPUT", output_rules),
        ):
            if run([*_IPT, "-n", "-L", chain], check=False).returncode != 0:
                run([*_IPT, "-N", chain])
            run([*_IPT, "-F", chain])
            for rule in rules:
                run([*_IPT, "-A", chain, *rule])
            if run([*_IPT, "-C", hook, "-j", chain], check=False).returncode != 0:
                run([*_IPT, "-I", hook, "1", "-j", chain])

    def remove(self) -> bool:
        """Remove every jump to the chains and the chains (idempotent), then verify.

        Returns:
            Whether anything was there to remove (False: an earlier revert did it).

        Raises:
            FaultError: a rule or chain of this fault is still there.
        """
        found = False
        for chain, hook in ((self.input, "INPUT"), (self.output, "OUTPUT")):
            for _ in range(100):  # each -D removes one jump; duplicates are removed too
                if run([*_IPT, "-C", hook, "-j", chain], check=False).returncode != 0:
                    break
                run([*_IPT, "-D", hook, "-j", chain])
                found = True
            if run([*_IPT, "-n", "-L", chain], check=False).returncode == 0:
                run([*_IPT, "-F", chain])
                run([*_IPT, "-X", chain])
                found = True
        self.check_gone()
        return found

    def check_gone(self) -> None:
        """Raise :class:`FaultError` naming every rule of this fault still in ``iptables -S``."""
        left = [line for line in run([*_IPT, "-S"]).stdout.splitlines() if self.tag in line]
        if left:
            raise FaultError(f"iptables rules of this fault are still present: {left}")


_RulesT = TypeVar("_RulesT", bound=FaultRequest)


class _IptablesFault(Fault[_RulesT]):
    """Shared shape: rules computed in prepare, installed in inject, removed in revert."""

    def __init__(self, request: _RulesT) -> None:
        super().__init__(request)
        self._chains = Chains(request.id)
        self._input: list[list[str]] = []
        self._output: list[list[str]] = []

    def inject(self, ctx: FaultContext) -> Injection:
        try:
            self._chains.install(self._input, self._output)
        except FaultError:
            self._chains.remove()  # nothing half-applied: a failed fault is never reverted
            raise
        return Injection(
            details={
                "chains": [self._chains.input, self._chains.output],
                "input_rules": self._input,
                "output_rules": self._output,
            }
        )

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Remove the chains and the jumps to them; they are checked gone (:meth:`verify`)."""
        self._chains.remove()

    def verify(self, ctx: FaultContext, injection: Injection | None) -> None:
        """No ``iptables -S`` line names this fault's chains.

        Raises:
            FaultError: naming the rules left.
        """
        self._chains.check_gone()


class Partition(_IptablesFault[PartitionRequest]):
    """DROP to and/or from the peers; revert verifies TCP connectivity to the peers again."""

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.request
        for peer in spec.peers:
            net = _network(peer.address)
            if spec.direction in ("both", "inbound"):
                self._input.append(["-s", net, "-j", "DROP"])
            if spec.direction in ("both", "outbound"):
                self._output.append(["-d", net, "-j", "DROP"])

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Remove the rules, then connect to each peer's ``verify_port``.

        A retry (the rules were already gone: an earlier attempt failed the check)
        tries each peer once, so a peer that stays down does not hold the agent's
        fault engine for ``verify_timeout_seconds`` on every TTL pass.

        Raises:
            FaultError: rules left, or a peer still unreachable after
                ``verify_timeout_seconds`` (the message names it).
        """
        removed = self._chains.remove()
        spec = self.request
        if injection is None:
            return
        if _other_fault_rules():
            # another network fault is still applied here: connectivity is its to restore
            log.info("partition %s: other fault rules present; connectivity not checked", spec.id)
            return
        for peer in spec.peers:
            if peer.verify_port is None or "/" in peer.address:
                continue
            where = (peer.address, peer.verify_port)
            timeout = spec.verify_timeout_seconds if removed else 0.0
            if not wait_until(lambda w=where: _connects(w), timeout, interval=0.2):
                raise FaultError(
                    f"partition reverted but {where[0]}:{where[1]} is still unreachable "
                    f"after {timeout:g} s"
                )


def _other_fault_rules() -> list[str]:
    """Rules of other network faults still present (chains ``SWI-``/``SWO-``)."""
    lines = run([*_IPT, "-S"]).stdout.splitlines()
    return [line for line in lines if "SWI-" in line or "SWO-" in line]


def _connects(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=1.0):
            return True
    except OSError:
        return False


class IsolateStore(_IptablesFault[IsolateStoreRequest]):
    """DROP this node's TCP packets to the store's host and port (and the replies)."""

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.request
        endpoint = None
        if spec.store is not None:  # validated: HOST:PORT
            host, port = spec.store.rsplit(":", 1)
            endpoint = host, int(port)
        else:
            for agent in torchruns(ctx, job_ranks(ctx, spec.job)):
                endpoint = store_endpoint(agent.cmdline())
                if endpoint is not None:
                    break
        if endpoint is None:
            raise FaultTargetNotFound(
                f"no rendezvous endpoint found on node {ctx.node}; give 'store' (host:port)"
            )
        host, port = endpoint[0], str(endpoint[1])
        try:
            address = socket.gethostbyname(host)
        except OSError as exc:
            raise FaultError(f"store: cannot resolve {host!r}: {exc}") from exc
        self._output = [["-p", "tcp", "-d", address, "--dport", port, "-j", "DROP"]]
        self._input = [["-p", "tcp", "-s", address, "--sport", port, "-j", "DROP"]]

    def inject(self, ctx: FaultContext) -> Injection:
        injection = super().inject(ctx)
        rule = self._output[0]  # -p tcp -d ADDRESS --dport PORT -j DROP
        return Injection(details={**injection.details, "store": f"{rule[3]}:{rule[5]}"})


class PacketDrop(_IptablesFault[PacketDropRequest]):
    """``statistic --mode random`` DROP in both directions (never on loopback)."""

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.request
        stat = ["-m", "statistic", "--mode", "random", "--probability", f"{spec.probability:.6f}"]
        self._input = [["-i", "lo", "-j", "RETURN"]]
        self._output = [["-o", "lo", "-j", "RETURN"]]
        if spec.peers is None:
            self._input.append([*stat, "-j", "DROP"])
            self._output.append([*stat, "-j", "DROP"])
        for peer in spec.peers or []:
            self._input.append(["-s", _network(peer), *stat, "-j", "DROP"])
            self._output.append(["-d", _network(peer), *stat, "-j", "DROP"])


_NETWORK = "network_switch_cable"  # a lost link between nodes (or to the rendezvous store)
PARTITION = FaultKind(
    kind="partition",
    summary=(
        "Network partition between node sets (iptables DROP on side A's nodes). ``direction``: "
        "``both`` (nothing passes), ``outbound`` (A -> B dropped, B -> A passes at IP level) or "
        "``inbound`` (B -> A dropped). Revert checks that A can connect to each B agent's port "
        "again within ``verify_timeout_seconds``, and fails loudly otherwise (FC-13)."
    ),
    traits=Traits(
        target=Target.NODE_SETS,
        placement=Placement.EACH_NODE,
        category=_NETWORK,
        detect_class=DetectClass.PARTITION,
        needs_root=True,
        fixed_place="it names its nodes in 'nodes'",
    ),
    targeting=NodeSets,
    request=PartitionRequest,
    fault=Partition,
)
ISOLATE_STORE = FaultKind(
    kind="isolate_store",
    summary=(
        "Drop a node's traffic to the rendezvous store only (``store`` ``host:port``; default: "
        "the ``--rdzv-endpoint`` of the job's torchrun on that node)."
    ),
    traits=Traits(
        target=Target.NODE_OR_RANK,
        placement=Placement.ONE_NODE,
        category=_NETWORK,
        detect_class=DetectClass.STORE_ISOLATION,
        job_scoped=True,
        needs_root=True,
    ),
    targeting=NodeOrRank,
    request=IsolateStoreRequest,
    fault=IsolateStore,
)
PACKET_DROP = FaultKind(
    kind="packet_drop",
    summary=(
        "Random packet loss on the node (iptables ``statistic --mode random``), in and out, "
        "optionally only to/from ``peers`` (node names): a flaky cable or switch port."
    ),
    traits=Traits(
        target=Target.NODE_OR_RANK,
        placement=Placement.ONE_NODE,
        detect_class=DetectClass.PACKET_LOSS,
        needs_root=True,
    ),
    targeting=NodeOrRankPeers,
    request=PacketDropRequest,
    fault=PacketDrop,
)

__all__ = [
    "ISOLATE_STORE",
    "PACKET_DROP",
    "PARTITION",
    "Chains",
    "IsolateStore",
    "IsolateStoreRequest",
    "NodeOrRankPeers",
    "PacketDrop",
    "PacketDropRequest",
    "Partition",
    "PartitionRequest",
    "Peer",
]
