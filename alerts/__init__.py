"""stormwatch.alerts: Prometheus rules, Alertmanager configuration and the responder.

* ``rules/*.yml``: the shipped rules (:func:`rules_dir`), unit-tested by
  ``tests/*.yml`` with promtool (:func:`check_rules`, :func:`run_rule_tests`).
* :func:`render_alertmanager_config` / :func:`write_alertmanager_config`:
  ``alertmanager.yml`` routing to the responder (typed models, PyYAML).
* :func:`render_inventory` / :func:`write_inventory`: the expected inventory, the nodes
  that must run an agent, as a rule file (``rules/targets.yml`` compares it with ``up``).
* :class:`Responder`: Alertmanager webhook receiver with durable, deduplicated
  incidents, one per Alertmanager alert group (``IncidentRecord`` with its
  ``IncidentMember`` alerts; SQLite), and background actions
  (:class:`Playbook`, :class:`Action`), each run once per incident.
* The responder's HTTP records are :mod:`stormwatch.contracts.responder`; its client is
  :class:`stormwatch.clients.ResponderClient`, and Prometheus is queried with
  :class:`stormwatch.clients.AsyncPrometheusClient`.
* :class:`Policy` (:func:`load_policy`, :func:`default_policy`): the runbook policy
  file, alert -> action kinds and the guards; :func:`playbook_from_policy`.
* :class:`Guardrails` + :class:`AuditLog`: restart budget, rate limit, circuit
  breaker, concurrency, dry-run and approvals around every action, with an
  append-only audit log (SQLite table + JSONL).
* Remedial actions act through a :class:`stormwatch.platforms.PlatformBackend` (lab,
  Kubernetes, Slurm): restart workers, exclude a node, checkpoint now, collect diagnostics.
* :mod:`stormwatch.alerts.incident_report`: the incident source of the post-mortem
  engine (:mod:`stormwatch.postmortem`): the report the responder writes when an
  incident closes (Markdown, one self-contained HTML page, JSON, plots);
  ``stormwatch alerts postmortem INCIDENT`` writes it again.

Exceptions::

    StormwatchError
    ├── ConfigError                 bad settings, token file, URL, duration
    └── AlertsError
        ├── ToolError               promtool/amtool missing or failing to run
        ├── StoreError              the responder's SQLite database
        │   └── NotAResponderDatabase   a --db file that is not one (a ConfigError too)
        └── UnknownIncident         no such incident (a ConfigError too)

Raised from the shared home (see :mod:`stormwatch.errors`): the clients'
``PrometheusAPIError`` / ``ResponderClientError`` and the platforms' ``BackendError``.
"""

from stormwatch.alerts.actions import (
    RANK_STALLED,
    Action,
    ActionOutcome,
    ConfirmRestart,
    ConfirmRestartSettings,
    Playbook,
    default_playbook,
)
from stormwatch.alerts.actions.playbook import playbook_from_policy
from stormwatch.alerts.actions.remedial import (
    CheckpointNow,
    CollectDiagnostics,
    ExcludeNodeRestart,
    NotifyOnly,
    RestartWorkers,
)
from stormwatch.alerts.alertmanager import (
    AlertmanagerConfig,
    AlertmanagerSettings,
    build_alertmanager_config,
    build_inhibit_rules,
    build_routes,
    render_alertmanager_config,
    write_alertmanager_config,
)
from stormwatch.alerts.errors import (
    AlertsError,
    NotAResponderDatabase,
    StoreError,
    ToolError,
    UnknownIncident,
)
from stormwatch.alerts.policy import Guards, Policy, Rule, default_policy, load_policy, parse_policy
from stormwatch.alerts.responder.audit import AuditEntry, AuditLog
from stormwatch.alerts.responder.guards import Guardrails
from stormwatch.alerts.responder.payload import WebhookAlert, WebhookMessage
from stormwatch.alerts.responder.service import Responder, serve
from stormwatch.alerts.responder.settings import ResponderSettings
from stormwatch.alerts.rulefiles import (
    ToolRun,
    check_rules,
    rule_files,
    rule_test_files,
    rules_dir,
    run_rule_tests,
)
from stormwatch.contracts.inventory import INVENTORY_METRIC, render_inventory, write_inventory

__all__ = [
    "INVENTORY_METRIC",
    "RANK_STALLED",
    "Action",
    "ActionOutcome",
    "AlertmanagerConfig",
    "AlertmanagerSettings",
    "AlertsError",
    "AuditEntry",
    "AuditLog",
    "CheckpointNow",
    "CollectDiagnostics",
    "ConfirmRestart",
    "ConfirmRestartSettings",
    "ExcludeNodeRestart",
    "Guardrails",
    "Guards",
    "NotAResponderDatabase",
    "NotifyOnly",
    "Playbook",
    "Policy",
    "Responder",
    "ResponderSettings",
    "RestartWorkers",
    "Rule",
    "StoreError",
    "ToolError",
    "ToolRun",
    "UnknownIncident",
    "WebhookAlert",
    "WebhookMessage",
    "build_alertmanager_config",
    "build_inhibit_rules",
    "build_routes",
    "check_rules",
    "default_playbook",
    "default_policy",
    "load_policy",
    "parse_policy",
    "playbook_from_policy",
    "render_alertmanager_config",
    "render_inventory",
    "rule_files",
    "rule_test_files",
    "rules_dir",
    "run_rule_tests",
    "serve",
    "write_alertmanager_config",
    "write_inventory",
]
