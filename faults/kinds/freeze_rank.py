"""``freeze_rank``: SIGSTOP one rank's worker; revert sends SIGCONT. Controller-side.

The controller signals the process directly (the lab shares one PID namespace),
so this kind has no agent request and no agent-side code: the controller's
injection and revert (``stormwatch.chaos.execution.injection.placement``,
``stormwatch.chaos.ledger.undo``) act on the process recorded in the ledger
(pid and start time). Nothing else reverts it: the controller starts a detached
reaper for its TTL. Prefer ``freeze_ranks`` (agent-side) on a cluster.
"""

from __future__ import annotations

from stormwatch.faults.kind import DetectClass, FaultKind, Placement, Target, Traits
from stormwatch.faults.targeting import RankTarget

FREEZE_RANK = FaultKind(
    kind="freeze_rank",
    summary=(
        "Freeze one rank's worker with SIGSTOP; revert sends SIGCONT (controller-side). The "
        "controller signals the process directly (the lab shares one PID namespace); a "
        "detached reaper reverts it when ``ttl_seconds`` expire, even if the controller died. "
        "Prefer ``freeze_ranks`` (agent-side) on a cluster."
    ),
    traits=Traits(
        target=Target.RANK,
        placement=Placement.CONTROLLER,
        # a hung rank: its peers block in a collective until the watchdog fires
        category="nccl_watchdog_timeouts",
        detect_class=DetectClass.HUNG_RANK,
        reverts_itself=False,
    ),
    targeting=RankTarget,
)

__all__ = ["FREEZE_RANK"]
