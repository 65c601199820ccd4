"""chaos/ledger: the controller's durable fault ledger and everything that reverts from it.

* :mod:`.ledger`: the SQLite ledger, written before a fault is sent (FC-13); its row
  (``LedgerEntry``, with where a fault landed: ``FaultTarget``, ``AgentRequest``) is the
  shared contract :mod:`stormwatch.contracts.fault_ledger` (journals embed it);
* :mod:`.tokens`: the agents' Bearer token of a row's target, read when used;
* :mod:`.undo`: undo one fault from its entry alone, by its kind's traits
  (:mod:`stormwatch.faults`): SIGCONT, the agent's ``DELETE``, reviving a killed agent;
* :mod:`.revert`: revert open or overdue entries (rollbacks, ``chaos revert``, start-up);
* :mod:`.reaper`: the detached TTL reaper of kinds that do not revert themselves.
"""
