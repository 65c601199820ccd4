"""Every metric a dashboard uses exists in agent/catalogue.csv, a recording rule or Prometheus."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import yaml

from stormwatch.dashboards import build_all

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_INTERNAL = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds"}
#: PromQL functions, aggregations and keywords that look like identifiers.
NOT_METRICS = {
    "sum", "avg", "min", "max", "count", "quantile", "by", "without", "on", "ignoring",
    "group_left", "group_right", "bool", "and", "or", "unless", "offset", "rate", "increase",
    "irate", "delta", "histogram_quantile", "time", "vector", "label_values", "le",
}  # fmt: skip
_IDENT = re.compile(r"(?<![\w:.\"$])([a-zA-Z_:][\w:]*)\s*(?=[{\[ )]|$)")


def _catalogue() -> dict[str, str]:
    with (ROOT / "agent" / "catalogue.csv").open(newline="") as f:
        return {row["name"]: row["type"] for row in csv.DictReader(f)}


def _recording_rules() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "alerts" / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names.update(rule["record"] for rule in group["rules"] if "record" in rule)
    return names


def _strip(expr: str) -> str:
    expr = re.sub(r"label_values\(([^,]+),\s*\w+\)", r"\1", expr)  # the label is no metric
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    expr = re.sub(r"\[[^\]]*\]", "[]", expr)  # range selectors
    expr = re.sub(r"\{\{\w+\}\}", "", expr)
    # label names inside selectors and by/on (...) clauses
    expr = re.sub(r"\{[^}]*\}", "{}", expr)
    return re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", expr)


def metric_names(expr: str) -> set[str]:
    """Identifiers in ``expr`` that look like metric names (loose PromQL scan)."""
    found = set()
    for match in _IDENT.finditer(_strip(expr)):
        name = match.group(1)
        if name not in NOT_METRICS and not re.fullmatch(r"\d.*", name):
            found.add(name)
    return found


def _queries() -> list[tuple[str, str]]:
    queries = []
    for data in build_all().values():
        stack: list[dict[str, Any]] = list(data["panels"])
        while stack:
            panel = stack.pop()
            stack.extend(panel.get("panels", []))
            for target in panel.get("targets", []):
                queries.append((f"{data['title']} / {panel['title']}", target["expr"]))
        for variable in data["templating"]["list"]:
            if variable["type"] == "query":
                queries.append((f"{data['title']} ${variable['name']}", variable["query"]))
    return queries


def test_scanner_finds_metric_names() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (op, le) (rate(a_seconds_bucket{job=~"$job"}[5m])))'
        " / on (job) group_left quantile by (job) (0.5, rec:b:rate2m) + time() - c"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "rec:b:rate2m", "c"}
    assert metric_names('label_values(stormwatch_train_step{job=~"$job"}, rank)') == {
        "stormwatch_train_step"
    }


def test_every_dashboard_metric_exists() -> None:
    catalogue = _catalogue()
    known = set(catalogue) | _recording_rules() | PROMETHEUS_INTERNAL
    for name, kind in catalogue.items():
        if kind == "histogram":
            known |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    queries = _queries()
    assert len(queries) > 60
    used: set[str] = set()
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        missing = names - known
        assert not missing, f"{where}: {sorted(missing)} not in agent/catalogue.csv or rules"
        used |= names
    assert "stormwatch_collective_latency_seconds_bucket" in used
