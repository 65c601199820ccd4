"""The agent's fault API engine: the manager and its durable ledger.

The kinds themselves (request models, traits, ``prepare``/``inject``/``revert``)
are declared once in :mod:`stormwatch.faults` (catalogue: docs/faults.md); the
agent validates request bodies with :func:`stormwatch.faults.parse_request`,
applies them through :class:`FaultManager` and records them in :class:`FaultLedger`
(rows: :class:`FaultRecord`, also the fault API's JSON).
"""

from __future__ import annotations

from stormwatch.agent.faults.ledger import FaultLedger, FaultRecord, FaultState
from stormwatch.agent.faults.manager import FaultManager

__all__ = ["FaultLedger", "FaultManager", "FaultRecord", "FaultState"]
