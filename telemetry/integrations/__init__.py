"""Integrations of :mod:`stormwatch.telemetry` with training frameworks.

Each module imports its framework (importing :mod:`stormwatch.telemetry` does not):
:mod:`.lightning` (PyTorch Lightning: ``StormwatchCallback``). An integration uses the
public API only (``init``, ``step``, ``phase``, ``checkpoint``, ``shutdown``), so a new
one for another framework has the same shape: initialise once per rank, mark each
optimizer step, wrap what pauses progress in a phase, record checkpoints, shut down
after a clean end.
"""
