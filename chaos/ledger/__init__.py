"""chaos/ledger: the controller's durable fault ledger and everything that reverts from it.

* :mod:`.ledger`: the SQLite ledger and its row model (``LedgerEntry``), written before
  a fault is sent (FC-13);
* :mod:`.rows`: where a fault landed (``FaultTarget``, ``AgentRequest``: the ``target``
  column);
* :mod:`.undo`: undo one fault from its entry alone, by its kind's traits
  (:mod:`stormwatch.faults`): SIGCONT, the agent's ``DELETE``, reviving a killed agent;
* :mod:`.revert`: revert open or overdue entries (rollbacks, ``chaos revert``, start-up);
* :mod:`.reaper`: the detached TTL reaper of kinds that do not revert themselves.
"""
