"""The Helm chart (deploy/kubernetes/helm/stormwatch) is the kustomize base, with the namespace
and images as values, and what it renders validates against the Kubernetes schemas.

No ``helm`` binary installs offline here (it is a Go program), so the chart is rendered by
:func:`_helm_template`, which implements exactly the template actions the generator may write
(``kube.helm.ACTIONS``); a test checks that the templates hold no other action, so this
rendering is what ``helm template`` gives for this chart.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
sys.path.insert(0, str(DEPLOY))
from kube import helm  # noqa: E402  (deploy/ is not a package: render.py's own import)

CHART = DEPLOY / "kubernetes" / "helm" / helm.CHART


def _actions(text: str) -> list[str]:
    """Every ``{{ ... }}`` action of a template, longest escapes first (``{{ "}}" }}``)."""
    found = []
    position = 0
    while (start := text.find("{{", position)) != -1:
        for known in sorted(helm.ACTIONS, key=len, reverse=True):
            if text.startswith(known, start):
                found.append(known)
                position = start + len(known)
                break
        else:
            end = text.find("}}", start)
            found.append(text[start : end + 2])
            position = end + 2
    return found


def _helm_template(text: str, namespace: str, values: dict[str, Any]) -> str:
    """What ``helm template --namespace NAMESPACE`` prints for one template of this chart."""
    printed = {
        action: {"{{": "{{", "}}": "}}", "Release.Namespace": namespace}.get(path)
        for action, path in helm.ACTIONS.items()
    }
    for action, path in helm.ACTIONS.items():
        if path.startswith("Values."):
            value: Any = values
            for key in path.split(".")[1:]:
                value = value[key]
            printed[action] = str(value)
    out, position = [], 0
    while (start := text.find("{{", position)) != -1:
        out.append(text[position:start])
        action = next(
            a for a in sorted(helm.ACTIONS, key=len, reverse=True) if text.startswith(a, start)
        )
        out.append(str(printed[action]))
        position = start + len(action)
    out.append(text[position:])
    return "".join(out)


def _templates() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((CHART / "templates").glob("*.yaml"))}


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def test_the_chart_is_helm_v2_and_names_its_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "stormwatch"
    assert chart["version"] == chart["appVersion"] == _values()["image"]["tag"]


def test_templates_hold_only_the_actions_the_renderer_knows() -> None:
    for name, text in _templates().items():
        unknown = [a for a in _actions(text) if a not in helm.ACTIONS]
        assert not unknown, f"{name}: {unknown}"


def test_the_chart_renders_the_kustomize_base_object_for_object(kit: Any) -> None:
    base = kit.kustomize(kit.kubernetes / "base")
    rendered = [
        obj
        for text in _templates().values()
        for obj in kit.load_objects(_helm_template(text, "stormwatch", _values()))
    ]
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    assert sorted(rendered, key=key) == sorted(base, key=key)


def test_another_namespace_and_images_validate_against_the_schemas(kit: Any) -> None:
    values = {
        "image": {"repository": "registry.example/sw", "tag": "1.2"},
        "agentImage": {"repository": "registry.example/sw-agent", "tag": "1.2"},
        "runbookBaseUrl": "https://wiki.example/runbooks",
    }
    objects = [
        obj
        for text in _templates().values()
        for obj in kit.load_objects(_helm_template(text, "gpu-monitoring", values))
    ]
    assert len(objects) > 10
    for obj in objects:
        kit.validate(obj)
        if "namespace" in obj["metadata"]:
            assert obj["metadata"]["namespace"] == "gpu-monitoring"
    images = {
        c["image"]
        for o in objects
        if o["kind"] in ("DaemonSet", "Deployment")
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example/sw:1.2", "registry.example/sw-agent:1.2"}
    rules = next(o for o in objects if o["kind"] == "PrometheusRule")
    text = yaml.safe_dump(rules)
    assert "{{ $labels.node }}" in text, "alert templates reach Prometheus unchanged"
    urls = {
        r["annotations"]["runbook_url"]
        for g in rules["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert urls and all(u.startswith("https://wiki.example/runbooks#") for u in urls)
    receiver = yaml.safe_dump(next(o for o in objects if o["kind"] == "AlertmanagerConfig"))
    assert "stormwatch-responder.gpu-monitoring.svc" in receiver


@pytest.mark.parametrize("template", ["prometheusrule.yaml", "dashboards.yaml"])
def test_prometheus_and_grafana_braces_are_escaped(template: str) -> None:
    text = _templates()[template]
    assert helm.OPEN_ACTION in text and helm.CLOSE_ACTION in text
