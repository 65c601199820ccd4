"""Alerting: every rule group in a PrometheusRule, the responder's routes as an
AlertmanagerConfig."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from kube.common import NAMESPACE, PART_OF, RESPONDER_PORT, TOKEN_SECRET, Obj, meta
from stormwatch.alerts.alertmanager import (
    AlertmanagerSettings,
    Route,
    build_alertmanager_config,
)
from stormwatch.alerts.rulefiles import rule_groups


def prometheus_rule() -> Obj:
    """Every rule group of alerts/rules/*.yml, unchanged, in one PrometheusRule."""
    groups: list[Obj] = rule_groups()
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": meta("stormwatch", PART_OF),
        "spec": {"groups": groups},
    }


def _matcher(text: str) -> Obj:
    for op in ("=~", "!~", "!=", "="):
        name, sep, value = text.partition(op)
        if sep:
            return {"name": name, "matchType": op, "value": json.loads(value)}
    raise ValueError(f"not a matcher: {text!r}")  # pragma: no cover - our own routes


def _crd_route(route: Route) -> Obj:
    out: Obj = {"receiver": route.receiver}
    if route.matchers:
        out["matchers"] = [_matcher(m) for m in route.matchers]
    for name, key in (
        ("group_by", "groupBy"),
        ("group_wait", "groupWait"),
        ("group_interval", "groupInterval"),
        ("repeat_interval", "repeatInterval"),
    ):
        if getattr(route, name) is not None:
            out[key] = getattr(route, name)
    if route.routes:
        out["routes"] = [_crd_route(r) for r in route.routes]
    return out


def alertmanager_config() -> Obj:
    """The responder's routes and inhibitions (``stormwatch.alerts.alertmanager``, with its
    defaults: Alertmanager's own timings) as an AlertmanagerConfig. The
    Prometheus Operator scopes its routes to alerts whose ``namespace`` label is this
    namespace unless the Alertmanager uses it as its global config
    (docs/deploy-kubernetes.md); the Bearer token comes from the responder's Secret."""
    url = f"http://stormwatch-responder.{NAMESPACE}.svc:{RESPONDER_PORT}"
    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp) / "token"  # the settings insist the file exists; the CRD uses a Secret
        token.write_text("unused\n")
        config = build_alertmanager_config(
            AlertmanagerSettings(responder_url=url, token_file=token)
        )
    webhook = config.receivers[0].webhook_configs[0]
    crd_webhook = {
        "url": webhook.url,
        "sendResolved": webhook.send_resolved,
        "maxAlerts": webhook.max_alerts,
        "httpConfig": {
            "authorization": {
                "type": "Bearer",
                "credentials": {"name": TOKEN_SECRET, "key": "token"},
            }
        },
    }
    return {
        "apiVersion": "monitoring.coreos.com/v1alpha1",
        "kind": "AlertmanagerConfig",
        "metadata": meta("stormwatch", PART_OF),
        "spec": {
            "route": _crd_route(config.route),
            "receivers": [
                {"name": r.name, "webhookConfigs": [crd_webhook]} for r in config.receivers
            ],
            "inhibitRules": [
                {
                    "sourceMatch": [_matcher(m) for m in rule.source_matchers],
                    "targetMatch": [_matcher(m) for m in rule.target_matchers],
                    "equal": list(rule.equal),
                }
                for rule in config.inhibit_rules
            ],
        },
    }
