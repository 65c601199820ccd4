"""Every dashboard query runs on a real Prometheus scraping a real sim agent.

Prometheus (Debian ``prometheus``, 1 s scrapes, the shipped alert and recording
rules loaded) scrapes ``stormwatch agent run --gpu-backend sim --sim-gpus 2`` on
free loopback ports. Every panel query and template-variable query is sent to
``/api/v1/query`` with the variables substituted as Grafana does: each must be
accepted (HTTP 200, status success). Queries built only from the agent's node,
GPU and NVLink metrics must also return data, instant and over a range. Training,
rank, fault and alert panels may be empty here: no trainer runs and nothing fires.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stormwatch.alerts import rule_files
from stormwatch.dashboards import build_all

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<metric>.+),\s*)?(?P<label>\w+)\)$")
#: Grafana's built-in interval variables, as a dashboard on a 1 s scrape interval gets them.
_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "interval": "15s"}
#: Catalogue sources whose metrics a sim agent exports without a trainer or a fault.
_ALWAYS_THERE = {"agent", "gpu", "nvlink", "host"}
#: Agent metrics that only exist after an event, with the reason.
_EVENT_ONLY = {
    "stormwatch_gpu_xid_errors_total": "created by the first XID; sim GPUs report none",
}
_PROMETHEUS_THERE = {"up", "scrape_duration_seconds"}
_IDENT = re.compile(r"\b([a-zA-Z_:][\w:]*)\b")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, **params: str) -> tuple[int, Any]:
    query = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}?{query}" if params else url, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Prometheus on 127.0.0.1:<free> scraping a sim agent labelled node=n0.

    Yields (Prometheus URL, the agent's metrics dir).
    """
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (apt install prometheus; `make setup` does it)")
    agent_log = tmp_path / "agent.log"
    stormwatch = Path(sys.executable).with_name("stormwatch")
    with agent_log.open("wb") as sink:
        agent = subprocess.Popen(
            [
                str(stormwatch), "agent", "run", "--gpu-backend", "sim", "--sim-gpus", "2",
                "--listen", "127.0.0.1:0", "--node", "n0", "--sample-interval", "1",
                "--metrics-dir", str(tmp_path / "metrics"), "--state-dir", str(tmp_path / "state"),
                "--no-claim-unlabelled-ranks",
            ],
            stdout=sink,
            stderr=sink,
        )  # fmt: skip
    prom: subprocess.Popen[bytes] | None = None
    log = (tmp_path / "prometheus.log").open("wb")
    try:
        target: list[str] = []

        def listening() -> bool:
            assert agent.poll() is None, agent_log.read_text()
            found = re.search(r"listening on http://(\S+)", agent_log.read_text())
            if found:
                target.append(found.group(1))
            return bool(found)

        _wait_for(listening, 60, "agent listening")
        config = tmp_path / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(path) for path in rule_files()],
                    "scrape_configs": [
                        {
                            "job_name": "stormwatch-agent",
                            "static_configs": [{"targets": target, "labels": {"node": "n0"}}],
                        }
                    ],
                }
            )
        )
        port = _free_port()
        prom = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=log,
        )
        yield f"http://127.0.0.1:{port}", tmp_path / "metrics"
    finally:
        if prom is not None:
            _stop(prom)
        _stop(agent)
        log.close()


def _sources() -> dict[str, str]:
    with (ROOT / "agent" / "catalogue.csv").open(newline="") as f:
        return {row["name"]: row["source"] for row in csv.DictReader(f)}


def _must_have_data(expr: str, sources: dict[str, str]) -> bool:
    """True when every metric in ``expr`` is one a lone sim agent always exports."""
    names = {n for n in _IDENT.findall(re.sub(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]', "", expr))}
    metrics = {n for n in names if n in sources or n in _PROMETHEUS_THERE or ":" in n}
    if not metrics or any(":" in n or n in _EVENT_ONLY for n in metrics):
        return False
    return all(n in _PROMETHEUS_THERE or sources[n] in _ALWAYS_THERE for n in metrics)


def _substitute(expr: str, variables: dict[str, list[str]]) -> str:
    """Grafana's interpolation of a multi-value/All variable inside ``=~``: ``(a|b)``, escaped."""

    def value(match: re.Match[str]) -> str:
        name = match["name"] or match["braced"]
        if name in _BUILTINS:
            return _BUILTINS[name]
        values = variables.get(name) or [".*"]  # no values: Grafana's All (allValue .*)
        if values == [".*"]:
            return ".*"
        escaped = [re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return re.sub(r"\$(?:\{(?P<braced>\w+)\}|(?P<name>\w+))", value, expr)


def _variable_values(url: str, query: str, variables: dict[str, list[str]]) -> list[str]:
    match = _LABEL_VALUES.match(query.strip())
    assert match, f"unsupported template query {query!r}"
    params = {"match[]": _substitute(match["metric"], variables)} if match["metric"] else {}
    status, found = _get(f"{url}/api/v1/label/{match['label']}/values", **params)
    assert status == 200 and found["status"] == "success", (query, found)
    return sorted(found["data"])


def _wait_ready(url: str) -> None:
    def ready() -> bool:
        try:
            _, found = _get(
                url + "/api/v1/query", query="rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m])"
            )
        except OSError:
            return False
        tensor = _get(url + "/api/v1/query", query="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")[1]
        return len(found["data"]["result"]) == 2 and len(tensor["data"]["result"]) == 2

    _wait_for(ready, 90, "two scrapes of both sim GPUs")


def _run_queries(
    url: str, must_have_data: Callable[[str, str], bool]
) -> tuple[int, int, list[str]]:
    """Run every dashboard query; return (accepted, returned data, empty but allowed).

    ``must_have_data(where, expr)`` says whether an empty result fails the test.
    """
    checked = with_data = 0
    empty_allowed: list[str] = []
    for dashboard in build_all().values():
        variables: dict[str, list[str]] = {}
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                variables[variable["name"]] = _variable_values(url, variable["query"], variables)
        if "node" in variables:
            assert variables["node"] == ["n0"], dashboard["title"]
        if "gpu" in variables:
            assert variables["gpu"] == ["0", "1"], dashboard["title"]
        stack = list(dashboard["panels"])
        now = time.time()
        while stack:
            panel = stack.pop(0)
            stack.extend(panel.get("panels", []))
            for target in panel.get("targets", []):
                where = f"{dashboard['title']} / {panel['title']} [{target['refId']}]"
                expr = _substitute(target["expr"], variables)
                status, instant = _get(url + "/api/v1/query", query=expr)
                assert status == 200 and instant["status"] == "success", (where, expr, instant)
                checked += 1
                if not must_have_data(where, target["expr"]):
                    if not instant["data"]["result"]:
                        empty_allowed.append(where)
                    continue
                assert instant["data"]["result"], f"{where}: {expr} returned no data"
                _, ranged = _get(
                    url + "/api/v1/query_range",
                    query=expr,
                    start=str(now - 30),
                    end=str(now),
                    step="1",
                )
                assert ranged["data"]["result"], f"{where}: no range data for {expr}"
                with_data += 1
    print(f"{checked} queries accepted, {with_data} returned data as required;")
    print(f"{len(empty_allowed)} empty (allowed):", *empty_allowed, sep="\n  ")
    return checked, with_data, empty_allowed


def test_every_dashboard_query_runs_on_prometheus(prometheus: tuple[str, Path]) -> None:
    url, _ = prometheus
    _wait_ready(url)
    sources = _sources()
    checked, with_data, empty = _run_queries(url, lambda _, expr: _must_have_data(expr, sources))
    assert checked > 60
    assert with_data >= 35
    node_gpu = [w for w in empty if w.startswith("Stormwatch / Node and GPU")]
    assert node_gpu == ["Stormwatch / Node and GPU / XID errors by code [A]"]


#: Panels that stay empty with a healthy single-process trainer, and why.
_EMPTY_WITH_TRAINER = {
    # The rank watcher only claims torchrun workers; a lone `stormwatch train` is none.
    "Stormwatch / Cluster overview / Ranks up [A]",
    "Stormwatch / Cluster overview / Job health: live ranks vs world size [A]",
    "Stormwatch / Cluster overview / Restarts and unexpected exits [C]",
    "Stormwatch / Incidents / Unexpected rank exits [A]",
    # Counted only when a telemetry write fails.
    "Stormwatch / Training / Telemetry write errors [A]",
}


def test_training_panels_show_a_real_trainer(prometheus: tuple[str, Path], tmp_path: Path) -> None:
    """A real single-rank `stormwatch train` feeds the agent: training panels get data while
    it trains (its state gauges go once it exits: a finished job has no current step time
    or bandwidth, and judging them after the exit raced the agent marking it dead)."""
    url, metrics_dir = prometheus
    _wait_ready(url)
    stormwatch = Path(sys.executable).with_name("stormwatch")
    log = (tmp_path / "train.log").open("w")
    train = subprocess.Popen(
        [
            str(stormwatch), "train", "--steps", "100000", "--step-delay", "0.1", "--job", "j1",
            "--metrics-dir", str(metrics_dir), "--log-dir", str(tmp_path / "logs"),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "10",
            "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--seq-len", "32",
            "--micro-batch", "2", "--corpus-max-bytes", "20000", "--quiet",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _judge_training_panels(url, train)
    finally:
        train.terminate()
        try:
            train.wait(60)
        except subprocess.TimeoutExpired:
            train.kill()
            train.wait()
        log.close()


def _judge_training_panels(url: str, train: subprocess.Popen[bytes]) -> None:
    def rates_seen() -> bool:
        assert train.poll() is None, f"the trainer exited with {train.returncode}"
        query = (
            'training_job_rank_node:stormwatch_train_compute_seconds:rate2m{training_job="j1"} > 0'
        )
        saved = 'stormwatch_train_step{training_job="j1"} >= 25'  # two checkpoints saved (every 10)
        return all(
            bool(_get(url + "/api/v1/query", query=q)[1]["data"]["result"]) for q in (query, saved)
        )

    _wait_for(rates_seen, 120, "the trainer's rates and step 25 in Prometheus")
    _, with_data, empty = _run_queries(
        url,
        lambda where, _: (
            (
                where.startswith(("Stormwatch / Training", "Stormwatch / NVLink and collectives"))
                or (
                    where.startswith("Stormwatch / Cluster overview")
                    and "alert" not in where.lower()
                )
            )
            and where not in _EMPTY_WITH_TRAINER
        ),
    )
    assert with_data >= 35  # every Training, NVLink/collectives and overview panel but the above
    assert not {w for w in empty if w.startswith("Stormwatch / Training")} - _EMPTY_WITH_TRAINER
    assert train.poll() is None, "every panel was judged while the trainer ran"
