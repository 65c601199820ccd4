"""Contracts shared across components: the models of what one component writes and
another reads, declared once.

* :mod:`.responder`: the responder's HTTP records (notifications, incidents, actions).
* :mod:`.rank_env`: what a training rank's environment says about it (torchrun's variables
  and ``STORMWATCH_JOB``), read by the agent's rank watcher and the lab platform backend.
"""
