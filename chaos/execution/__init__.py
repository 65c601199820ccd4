"""chaos/execution: running an experiment.

Injecting faults: :mod:`.injector` (wait for the step, ledger first, then send) and
:mod:`.injection` (where a fault goes and how it is applied there, by its kind's
placement trait from :mod:`stormwatch.faults`). Reverting them is
:mod:`stormwatch.chaos.ledger`.
"""
