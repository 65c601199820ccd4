"""The Helm chart (deploy/kubernetes/helm/stormwatch): the kustomize base's own files as
templates, so that both come from the same builders.

Each template is the base file's YAML text with four things made values, and nothing else:

* the namespace (every ``namespace: stormwatch`` and the responder's in-cluster URL) is the
  release's, ``{{ .Release.Namespace }}``;
* the full image is ``{{ .Values.image.repository }}:{{ .Values.image.tag }}``;
* the agent's slim image is ``{{ .Values.agentImage.repository }}:{{ .Values.agentImage.tag }}``;
* the alerts' runbook base URL is ``{{ .Values.runbookBaseUrl }}`` (alerts/rulefiles.py).

Every ``{{`` and ``}}`` already in the text (alert annotations, dashboard JSON) is escaped as
``{{ "{{" }}`` / ``{{ "}}" }}``, so Helm prints them as they are. :data:`ACTIONS` lists every
template action the chart may contain (tests/deploy/test_helm_chart.py renders the chart with
exactly these, and checks that no other action appears).
"""

from __future__ import annotations

import re

from kube.common import AGENT_IMAGE, IMAGE, NAMESPACE
from stormwatch.alerts.rulefiles import DEFAULT_RUNBOOK_BASE_URL

CHART = "stormwatch"
#: The chart's version and the images' tag (the package's version).
VERSION = IMAGE.rsplit(":", 1)[1]

NAMESPACE_ACTION = "{{ .Release.Namespace }}"
IMAGE_ACTION = "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
AGENT_IMAGE_ACTION = "{{ .Values.agentImage.repository }}:{{ .Values.agentImage.tag }}"
RUNBOOK_ACTION = "{{ .Values.runbookBaseUrl }}"
OPEN_ACTION = '{{ "{{" }}'
CLOSE_ACTION = '{{ "}}" }}'
#: Every action a template may hold, with what it prints.
ACTIONS = {
    "{{ .Release.Namespace }}": "Release.Namespace",
    "{{ .Values.image.repository }}": "Values.image.repository",
    "{{ .Values.image.tag }}": "Values.image.tag",
    "{{ .Values.agentImage.repository }}": "Values.agentImage.repository",
    "{{ .Values.agentImage.tag }}": "Values.agentImage.tag",
    RUNBOOK_ACTION: "Values.runbookBaseUrl",
    OPEN_ACTION: "{{",
    CLOSE_ACTION: "}}",
}

_BRACES = re.compile(r"\{\{|\}\}")
_NAMESPACE_LINE = re.compile(rf"^(\s*namespace: ){re.escape(NAMESPACE)}$", re.MULTILINE)


def template(text: str) -> str:
    """The Helm template of one base file's text."""
    text = _BRACES.sub(lambda m: OPEN_ACTION if m.group() == "{{" else CLOSE_ACTION, text)
    text = _NAMESPACE_LINE.sub(lambda m: m.group(1) + NAMESPACE_ACTION, text)
    text = text.replace(f".{NAMESPACE}.svc", f".{NAMESPACE_ACTION}.svc")
    text = text.replace(f"image: {AGENT_IMAGE}\n", f"image: {AGENT_IMAGE_ACTION}\n")
    text = text.replace(
        f"runbook_url: {DEFAULT_RUNBOOK_BASE_URL}#", f"runbook_url: {RUNBOOK_ACTION}#"
    )
    return text.replace(f"image: {IMAGE}\n", f"image: {IMAGE_ACTION}\n")


def chart_yaml() -> str:
    return (
        "apiVersion: v2\n"
        f"name: {CHART}\n"
        "description: Observability and chaos testing for GPU training clusters (node agent,\n"
        "  alert rules, Alertmanager routes, responder, Grafana dashboards)\n"
        "type: application\n"
        f"version: {VERSION}\n"
        f'appVersion: "{VERSION}"\n'
    )


def values_yaml() -> str:
    repository, tag = IMAGE.rsplit(":", 1)
    agent_repository, agent_tag = AGENT_IMAGE.rsplit(":", 1)
    return (
        "# The full image: the responder (deploy/docker/Dockerfile's default target).\n"
        f"image:\n  repository: {repository}\n  tag: {tag}\n"
        "# The agent's slim image (the Dockerfile's `agent` target: no torch).\n"
        f"agentImage:\n  repository: {agent_repository}\n  tag: {agent_tag}\n"
        "# Absolute URL of the runbooks page; each alert's runbook_url is URL#<alert, lower case>.\n"
        f"runbookBaseUrl: {DEFAULT_RUNBOOK_BASE_URL}\n"
    )


__all__ = ["ACTIONS", "CHART", "chart_yaml", "template", "values_yaml"]
