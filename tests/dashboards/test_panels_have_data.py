"""Every panel query of every built dashboard returns data from the lab's Prometheus
after a short lab run in which the events the event panels show did happen.

Two lab nodes, one rank each (torchrun, gloo, sim GPUs). While the job trains:

* a fatal XID (48, double-bit ECC) on node0's GPU 0 (agent fault API ``gpu_xid``): the
  XID and ECC panels,
  ``StormwatchGpuXidFatal`` (an alert with a ``node``), the chaos-fault panels;
* SIGKILL of rank 1 (fault API ``kill_rank``): unexpected exits, torchrun's restart
  (restart count), ``StormwatchRankStalled`` (an alert with the job's ``training_job``);
* rank 0's done marker path is a directory, so the trainer's ``done_marker`` telemetry
  sink fails at start (training continues): the telemetry-errors panel.

Then every target of every panel is run as a range query over the run (what a Grafana
panel shows for that time range), with the template variables filled in as Grafana
does (every value their own queries return); each must return at least one series.
Run with ``flock /tmp/sw/lab.lock``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stormwatch.dashboards import build_all
from stormwatch.lab import JobSpec, Lab, LabConfig
from stormwatch.telemetry.ranklogs import read_job_logs

pytestmark = [pytest.mark.e2e, pytest.mark.root]

JOB = "panels"
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<metric>.+),\s*)?(?P<label>\w+)\)$")
#: Grafana's built-in interval variables for a dashboard on the lab's 1 s scrapes.
_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "interval": "15s"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config() -> LabConfig:
    ports: set[int] = set()
    while len(ports) < 3:
        ports.add(_free_port())
    prometheus, alertmanager, responder = sorted(ports)
    return LabConfig(
        prefix="swpanel",
        subnet=ipaddress.IPv4Network("10.217.0.0/24"),
        nodes=2,
        nproc_per_node=1,
        prometheus_port=prometheus,
        alertmanager_port=alertmanager,
        responder_port=responder,
        rdzv_port=29512,
    )


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=30) as reply:
        body = json.loads(reply.read())
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def _has_data(url: str, expr: str, start: float) -> bool:
    """Whether ``expr`` has any series between ``start`` and now (a Grafana time range)."""
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{time.time():.3f}", "step": "1"}
    encoded = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{encoded}", timeout=30) as reply:
        body = json.loads(reply.read())
    assert body["status"] == "success", (expr, body)
    return bool(body["data"]["result"])


def _label_values(url: str, query: str, variables: dict[str, str]) -> list[str]:
    match = _LABEL_VALUES.match(query.strip())
    assert match, f"unsupported template query {query!r}"
    params = {"match[]": _substitute(match["metric"], variables)} if match["metric"] else {}
    encoded = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(
        f"{url}/api/v1/label/{match['label']}/values{encoded}", timeout=30
    ) as reply:
        return sorted(json.loads(reply.read())["data"])


def _substitute(expr: str, variables: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match["name"] or match["braced"]
        return _BUILTINS.get(name) or variables.get(name, ".*")

    return re.sub(r"\$(?:\{(?P<braced>\w+)\}|(?P<name>\w+))", value, expr)


def _all_values(values: list[str]) -> str:
    """A multi-value variable with every value selected, as Grafana writes it in ``=~``."""
    escaped = [re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def _fault(lab: Lab, node: str, body: dict[str, Any]) -> None:
    state = lab.state
    token = Path(state.agent_token_file).read_text().strip()
    request = urllib.request.Request(
        f"{state.node(node).agent_fault_url}/v1/faults",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.status in (200, 201)
    except urllib.error.HTTPError as exc:
        pytest.fail(f"fault {body['kind']} on {node}: HTTP {exc.code} {exc.read()!r}")


def _empty_panels(url: str, start: float) -> tuple[int, list[str]]:
    checked, empty = 0, []
    for dashboard in build_all().values():
        variables: dict[str, str] = {}
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                values = _label_values(url, variable["query"], variables)
                assert values, f"{dashboard['title']}: variable {variable['name']} has no values"
                variables[variable["name"]] = _all_values(values)
        stack = list(dashboard["panels"])
        while stack:
            panel = stack.pop(0)
            stack.extend(panel.get("panels", []))
            for target in panel.get("targets", []):
                checked += 1
                expr = _substitute(target["expr"], variables)
                if not _has_data(url, expr, start):
                    empty.append(f"{dashboard['title']} / {panel['title']} [{target['refId']}]")
    return checked, empty


@pytest.mark.timeout(600)
def test_every_panel_shows_data_after_a_short_lab_run(
    tmp_path: Path, wait_for: Callable[..., Any]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab creates network namespaces")
    config = _config()
    lab = Lab(tmp_path / "run")
    try:
        lab.up(config)
        url = lab.state.prometheus_url
        # The trainer cannot remove a directory as its done marker: one telemetry error.
        marker = Path(lab.state.node("node0").metrics_dir) / "rank0.done"
        (marker / "keep").mkdir(parents=True)
        started = time.time()
        info = lab.start_job(JobSpec(name=JOB, steps=400, checkpoint_every=5, step_delay=0.2))

        def step_of(rank: int) -> int:
            logs = read_job_logs(Path(info.log_dir))
            last = logs[rank].last_step if rank in logs else None
            return last.step or 0 if last is not None else 0

        checkpointed = f'count(stormwatch_train_last_checkpoint_timestamp_seconds{{training_job="{JOB}"}}) == 2'
        wait_for(
            lambda: step_of(1) >= 7 and _query(url, checkpointed),
            240,
            "both ranks past step 7 with their step-5 checkpoint scraped",
            interval=0.5,
        )
        _fault(lab, "node0", {"id": "xid-1", "kind": "gpu_xid", "gpu": 0, "xid": 48})
        _fault(lab, "node1", {"id": "kill-1", "kind": "kill_rank", "rank": 1, "job": JOB})

        wait_for(
            lambda: (
                _query(url, f'ALERTS{{alertstate="firing", training_job="{JOB}"}}')
                and _query(url, 'ALERTS{alertstate="firing", node="node0"}')
            ),
            90,
            "alerts firing for the job and for node0",
            interval=0.5,
        )
        wait_for(
            lambda: (
                _query(
                    url,
                    f'training_job:stormwatch_train_job_restarts:max{{training_job="{JOB}"}} >= 1',
                )
                and _query(
                    url,
                    f'rate(stormwatch_train_steps_total{{training_job="{JOB}", rank="1"}}[15s]) > 0',
                )
                and _query(url, checkpointed)
            ),
            180,
            "the restarted job to train and checkpoint again",
            interval=0.5,
        )
        checked, empty = _empty_panels(url, started)
        steps = {r["metric"]["rank"]: r["value"][1] for r in _query(url, "stormwatch_train_step")}
    finally:
        lab.down(config)
    assert checked > 80
    assert not empty, f"panels without data (steps by rank {steps}):\n  " + "\n  ".join(empty)
