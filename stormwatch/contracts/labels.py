"""The Prometheus label that names the training job on stormwatch's series and alerts.

Every series about a training job (the ranks' own, written by
:mod:`stormwatch.telemetry.metrics`, and the agent's rank series,
``agent/catalogue.csv``) carries the job's name (``STORMWATCH_JOB``) in
:data:`TRAINING_JOB_LABEL`, beside ``rank``; so do the alerts about a job (the rules of
``alerts/rules``) and the incidents the responder opens from them. The label is not
``job``: Prometheus owns ``job`` (the scrape job, ``stormwatch-agent`` for the agents), and
keeping a training job's name in it took ``honor_labels: true`` on the agents' scrape,
which a Prometheus Operator with ``overrideHonorLabels`` turns off (issue 19).

Writers: the trainer's telemetry and the agent's collectors. Readers: the agent (which
merges the ranks' files and keys them by job and rank), the alert rules, Alertmanager's
grouping and inhibitions (:mod:`stormwatch.alerts.alertmanager`), the responder's actions,
the post-mortems, the chaos runner's probes and the dashboards.
"""

from __future__ import annotations

#: The training job's name on series and alerts (was ``job`` before issue 19).
TRAINING_JOB_LABEL = "training_job"

__all__ = ["TRAINING_JOB_LABEL"]
