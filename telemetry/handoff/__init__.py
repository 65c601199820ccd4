"""Handing a rank's per-step and per-collective telemetry off the training thread.

:mod:`.tally` (collectives as plain numbers in preallocated slots), :mod:`.metric_writes`
(metric updates held in memory, written in one go) and :mod:`.flusher` (the thread that
writes them, and the event log's queue, every 0.1 s). docs/instrument-your-job.md, "What
it costs the training thread". No torch import here.
"""
