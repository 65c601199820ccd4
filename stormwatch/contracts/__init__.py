"""Contracts shared across components: the models of what one component writes and
another reads, declared once.

* :mod:`.responder`: the responder's HTTP records (notifications, incidents, actions).
* :mod:`.rank_env`: what a training rank's environment says about it (torchrun's variables
  and ``STORMWATCH_JOB``), read by the agent's rank watcher and the lab platform backend.
* :mod:`.journal`: the experiment journal (``journal.json``), written by the chaos runner,
  read by the experiment and incident post-mortems.
* :mod:`.fault_ledger`: a row of the controller's fault ledger, written by the chaos
  ledger, embedded in every journal.
* :mod:`.inventory`: the expected inventory of agents (a Prometheus rule file), written by
  ``stormwatch alerts config inventory`` and the lab, read by Prometheus for the alert rules.
* :mod:`.labels`: the label naming the training job on series and alerts
  (``training_job``), written by the trainer's telemetry and the agent, read by the rules,
  the responder and the reports.

Each module's docstring names its writer; every reader uses the model.
"""
