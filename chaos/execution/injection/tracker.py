"""The faults of one run: which are still open (what must be reverted), and what the checks need.

The ledger is the durable record (the injector writes each fault there *before*
sending it, FC-13); :class:`FaultTracker` is the run's view of it plus two facts
the checks need that the ledger does not keep: when the latest fault took effect
(``progressing`` probes only count steps after it) and which faults are over once
sent (they get a recovery check instead of a revert).
"""

from __future__ import annotations

from stormwatch.chaos.execution.injection.injector import Injected
from stormwatch.chaos.ledger.ledger import Ledger
from stormwatch.contracts.fault_ledger import LedgerEntry
from stormwatch.faults import ExperimentFault


class FaultTracker:
    """What one experiment run injected.

    Args:
        ledger: the fault ledger the run's injector writes to.
        experiment_id: the run's id (its faults' ``experiment_id`` in the ledger).
    """

    def __init__(self, ledger: Ledger, experiment_id: str) -> None:
        self.ledger = ledger
        self.experiment_id = experiment_id
        self._last_fault_at: float | None = None
        self._self_reverting: list[str] = []

    @property
    def last_fault_at(self) -> float | None:
        """Unix time the latest fault took effect (None before any)."""
        return self._last_fault_at

    @property
    def self_reverting(self) -> tuple[str, ...]:
        """Names of the injected faults that are over once sent (``kill_rank``), in order."""
        return tuple(self._self_reverting)

    def injected(self, name: str, fault: ExperimentFault, injected: Injected) -> None:
        """Note that the action ``name`` injected ``fault`` (already ``injected`` in the ledger)."""
        self._last_fault_at = injected.result.applied_at
        if fault.traits.reverts_itself:
            self._self_reverting.append(name)

    def open_faults(self) -> list[LedgerEntry]:
        """This run's faults still open in the ledger: what must be reverted."""
        return self.ledger.open_faults(experiment_id=self.experiment_id)

    def entries(self) -> list[LedgerEntry]:
        """Every ledger entry of this run, open or closed."""
        return self.ledger.entries(experiment_id=self.experiment_id)


__all__ = ["FaultTracker"]
