"""``faults`` collector: what the fault ledger holds (counts survive agent restarts)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stormwatch.agent.collectors.base import new_family
from stormwatch.agent.faults.ledger import FaultLedger


class FaultsCollector:
    """Active, applied and reverted faults by kind, from the ledger."""

    name = "faults"

    def __init__(self, ledger: FaultLedger) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        active, injected, reverted = self._ledger.counts()
        active_family = new_family("stormwatch_faults_active")
        for kind in sorted(set(active) | set(injected)):
            active_family.add_metric([kind], float(active.get(kind, 0)))
        injected_family = new_family("stormwatch_faults_injected_total")
        for kind, n in sorted(injected.items()):
            injected_family.add_metric([kind], float(n))
        reverted_family = new_family("stormwatch_faults_reverted_total")
        for (kind, reason), n in sorted(reverted.items()):
            reverted_family.add_metric([kind, reason], float(n))
        yield from (active_family, injected_family, reverted_family)


__all__ = ["FaultsCollector"]
