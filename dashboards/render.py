"""Render the dashboards to deterministic JSON and write Grafana provisioning files.

``build_all()`` returns ``{uid: dashboard dict}``; ``write(out_dir, prometheus_url)``
writes ``<out>/dashboards/<uid>.json`` (sorted keys, 2-space indent, trailing
newline: building twice gives byte-identical files) plus
``<out>/provisioning/dashboards/stormwatch.yaml`` (a file provider pointing at the
JSON folder) and ``<out>/provisioning/datasources/stormwatch.yaml`` (the
Prometheus data source, uid :data:`DATASOURCE_UID`).

The data source is provisioned for a Grafana that has others: it does not claim to be the
organisation's default (``isDefault: false``; the dashboards select it by its fixed uid), and
it states a scrape interval (``timeInterval``) only when told one; the lab passes its 1 s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from stormwatch.dashboards import cluster, incidents, node_gpu, nvlink, training
from stormwatch.durations import parse_duration
from stormwatch.errors import ConfigError
from stormwatch.urls import is_http_url

#: Builders of every shipped dashboard, in menu order.
DASHBOARDS: tuple[Callable[[], Dashboard], ...] = (
    cluster.build,
    node_gpu.build,
    nvlink.build,
    training.build,
    incidents.build,
)
#: uid of the provisioned Prometheus data source (the dashboards' ``$datasource`` default).
DATASOURCE_UID = "stormwatch-prometheus"
#: Grafana folder the provisioned dashboards go to.
FOLDER = "Stormwatch"


def _number_panels(panels: list[dict[str, Any]], next_id: int) -> int:
    for panel in panels:
        panel["id"] = next_id
        next_id += 1
        next_id = _number_panels(panel.get("panels", []), next_id)
    return next_id


def render(dashboard: Dashboard) -> dict[str, Any]:
    """The dashboard as plain JSON data, panels numbered 1, 2, ... in layout order."""
    data: dict[str, Any] = json.loads(json.dumps(dashboard.build(), cls=JSONEncoder))
    _number_panels(data.get("panels", []), 1)
    for variable in data.get("templating", {}).get("list", []):
        if variable["type"] == "datasource":
            variable["current"] = {"text": "Prometheus", "value": DATASOURCE_UID}
    return data


def build_all() -> dict[str, dict[str, Any]]:
    """Every shipped dashboard rendered, keyed by uid."""
    rendered = [render(build()) for build in DASHBOARDS]
    return {data["uid"]: data for data in rendered}


def dumps(data: dict[str, Any]) -> str:
    """Deterministic JSON text: sorted keys, 2-space indent, UTF-8 kept, trailing newline."""
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def _check_url(url: str) -> str:
    if not is_http_url(url):
        raise ConfigError(
            f"--prometheus-url: {url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:9090"
        )
    return url.rstrip("/")


def provisioning(
    out_dir: Path, prometheus_url: str, *, scrape_interval: str | None = None
) -> dict[str, dict[str, Any]]:
    """Grafana provisioning documents, keyed by their path relative to ``out_dir``.

    Args:
        scrape_interval: the Prometheus' scrape interval (``timeInterval``, a Prometheus
            duration such as ``30s``), Grafana's lower bound for ``$__interval``; None
            leaves Grafana's default.

    Raises:
        ConfigError: ``prometheus_url`` is not an http(s) URL, or ``scrape_interval`` is
            not a Prometheus duration > 0.
    """
    json_data = (
        {} if scrape_interval is None else {"timeInterval": _check_interval(scrape_interval)}
    )
    return {
        "provisioning/dashboards/stormwatch.yaml": {
            "apiVersion": 1,
            "providers": [
                {
                    "name": "stormwatch",
                    "type": "file",
                    "folder": FOLDER,
                    "disableDeletion": False,
                    "allowUiUpdates": False,
                    "updateIntervalSeconds": 30,
                    "options": {"path": str((out_dir / "dashboards").resolve())},
                }
            ],
        },
        "provisioning/datasources/stormwatch.yaml": {
            "apiVersion": 1,
            "datasources": [
                {
                    "name": "Prometheus",
                    "uid": DATASOURCE_UID,
                    "type": "prometheus",
                    "access": "proxy",
                    "url": _check_url(prometheus_url),
                    "isDefault": False,
                    "jsonData": json_data,
                }
            ],
        },
    }


def _check_interval(text: str) -> str:
    """``text`` if it is a Prometheus duration > 0 (what Grafana's ``timeInterval`` takes).

    Raises:
        ConfigError: it is not (the message names ``--scrape-interval`` and examples).
    """
    if parse_duration(text, "--scrape-interval") <= 0:
        raise ConfigError(f"--scrape-interval: must be longer than 0 (got {text!r}); e.g. 15s, 1m")
    return text.strip()


def write(out_dir: Path, prometheus_url: str, *, scrape_interval: str | None = None) -> list[Path]:
    """Write every dashboard and the provisioning files under ``out_dir``; return the paths
    (``scrape_interval`` as for :func:`provisioning`).

    Raises:
        ConfigError: ``prometheus_url`` is not an http(s) URL, or ``out_dir`` cannot be written.
    """
    documents = provisioning(out_dir, prometheus_url, scrape_interval=scrape_interval)
    written: list[Path] = []
    try:
        (out_dir / "dashboards").mkdir(parents=True, exist_ok=True)
        for uid, data in sorted(build_all().items()):
            path = out_dir / "dashboards" / f"{uid}.json"
            path.write_text(dumps(data), encoding="utf-8")
            written.append(path)
        for relative, document in documents.items():
            path = out_dir / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(document, sort_keys=True), encoding="utf-8")
            written.append(path)
    except OSError as exc:
        raise ConfigError(f"--out: cannot write {out_dir}: {exc}; pick a writable folder") from exc
    return written
