"""NVIDIA's dcgm-exporter Grafana dashboard works on a real Prometheus scraping a sim agent.

Every panel query and every template-variable query of
``dcgm-exporter-dashboard.json`` is run against Prometheus's HTTP API, with the
variables substituted the way Grafana does it, and must return data.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<metric>[^,]+),\s*)?(?P<label>\w+)\)$")
#: Grafana's built-in interval variables, as a dashboard at a 1 s scrape interval gets them.
_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "interval": "15s"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, **params: str) -> Any:
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}?{query}" if params else url, timeout=30) as reply:
        return json.loads(reply.read())


@pytest.fixture
def prometheus(tmp_path: Path, agent_process: Any) -> Iterator[tuple[str, str]]:
    """A real Prometheus (1 s scrapes) on 127.0.0.1 scraping a sim agent; yields (URL, target)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (apt install prometheus; `make setup` does it)")
    agent = agent_process("--sim-gpus", "2", "--sample-interval", "1")
    target = agent.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "stormwatch-agent",
                        "static_configs": [{"targets": [target]}],
                    }
                ],
            }
        )
    )
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, target
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_ready(url: str, tools: Any) -> None:
    def ready() -> bool:
        try:
            found = _get(url + "/api/v1/query", query="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
        except OSError:
            return False
        return len(found["data"]["result"]) == 2  # both GPUs, after two GPM samples

    tools.wait_for(ready, timeout=90, interval=0.5)


def _variable_values(url: str, query: str) -> list[str]:
    match = _LABEL_VALUES.match(query.strip())
    assert match, f"unsupported template query {query!r}"
    params = {"match[]": match["metric"]} if match["metric"] else {}
    found = _get(f"{url}/api/v1/label/{match['label']}/values", **params)
    assert found["status"] == "success"
    return list(found["data"])


def _substitute(expr: str, variables: dict[str, list[str]]) -> str:
    """Grafana's interpolation of a multi-value/All variable inside ``=~``: ``(a|b)``, escaped."""

    def value(match: re.Match[str]) -> str:
        name = match["name"] or match["braced"]
        if name in _BUILTINS:
            return _BUILTINS[name]
        values = variables[name]
        escaped = [re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return re.sub(r"\$(?:\{(?P<braced>\w+)\}|(?P<name>\w+))", value, expr)


def test_every_dcgm_dashboard_query_returns_data(prometheus: tuple[str, str], tools: Any) -> None:
    url, target = prometheus
    _wait_ready(url, tools)
    dashboard = json.loads((tools.peers / "dcgm-exporter-dashboard.json").read_text())

    variables: dict[str, list[str]] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        values = _variable_values(url, variable["query"])
        assert values, f"template variable ${variable['name']} ({variable['query']}) has no values"
        variables[variable["name"]] = values
    assert variables["instance"] == [target]
    assert variables["gpu"] == ["0", "1"]

    panels: list[dict[str, Any]] = []
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        panels.append(panel)
    queried = 0
    now = time.time()
    for panel in panels:
        for target_spec in panel.get("targets", []):
            expr = _substitute(target_spec["expr"], variables)
            instant = _get(url + "/api/v1/query", query=expr)
            assert instant["status"] == "success", (panel["title"], expr, instant)
            assert instant["data"]["result"], f"panel {panel['title']!r}: {expr} returned no data"
            ranged = _get(
                url + "/api/v1/query_range",
                query=expr,
                start=str(now - 30),
                end=str(now),
                step="1",
            )
            assert ranged["data"]["result"], f"panel {panel['title']!r}: no range data for {expr}"
            queried += 1
    assert queried == 8  # the published dashboard's eight panels
