"""Builders of the Kubernetes objects in deploy/kubernetes/base and examples/ (plain dicts).

One module per part: :mod:`.common` (namespace, image, labels, ports), :mod:`.agent`,
:mod:`.alerting` (rules, Alertmanager routes), :mod:`.responder` (with its RBAC),
:mod:`.dashboards`, :mod:`.jobs` (example training jobs and job templates), :mod:`.chaos`
(the chaos controller's ClusterRole).

Every value the code already knows comes from the code: the agent's and the
responder's ports and flags, the rule groups of alerts/rules/, the Alertmanager
routes of ``stormwatch.alerts.alertmanager``, the dashboards of
``stormwatch.dashboards``, the platform settings of ``stormwatch.platforms``.
deploy/render.py writes them out; overlays (hand-written) adapt them.
"""

from __future__ import annotations

from kube.agent import agent_daemonset, agent_service, agent_service_account, agent_service_monitor
from kube.alerting import alertmanager_config, prometheus_rule
from kube.chaos import chaos_rbac
from kube.dashboards import dashboard_configmaps
from kube.jobs import job_template, jobset_template, template_prerequisites, training_job
from kube.responder import responder_objects

__all__ = [
    "agent_daemonset",
    "agent_service",
    "agent_service_account",
    "agent_service_monitor",
    "alertmanager_config",
    "chaos_rbac",
    "dashboard_configmaps",
    "job_template",
    "jobset_template",
    "prometheus_rule",
    "responder_objects",
    "template_prerequisites",
    "training_job",
]
