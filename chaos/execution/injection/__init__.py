"""Injecting an experiment's faults and keeping track of them.

- :mod:`.injector`: sends one fault: waits for its step, locates the rank, writes the
  ledger row first, then sends (FC-13); a kind that does not revert itself gets a
  detached TTL reaper;
- :mod:`.placement`: where a fault goes and how it is applied there, by its kind's
  placement trait (:mod:`stormwatch.faults`); reverting is :mod:`stormwatch.chaos.ledger`;
- :mod:`.tracker`: the run's faults: which are still open, when the latest took effect.
"""
