"""The metric catalogue is complete, typed right, and printable."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest
from click.testing import CliRunner

from stormwatch.agent import AgentError, FakeNvml, load_catalogue
from stormwatch.agent.catalogue import parse_catalogue
from stormwatch.agent.cli import agent as agent_cli
from stormwatch.agent.kube.testing import FakePod, KubeletServer
from stormwatch.telemetry import metrics as trainer_metrics

PEERS = Path(__file__).resolve().parents[3] / "shared" / "peers" / "dcgm-exporter"

#: Trainer metric names from docs/ARCHITECTURE.md ("Trainer -> agent telemetry").
TRAINER_CONTRACT = {
    "stormwatch_train_step": "gauge",
    "stormwatch_train_last_step_timestamp_seconds": "gauge",
    "stormwatch_train_loss": "gauge",
    "stormwatch_train_step_duration_seconds": "histogram",
    "stormwatch_train_tokens_per_second": "gauge",
    "stormwatch_train_world_size": "gauge",
    "stormwatch_train_node_restarts": "gauge",
    "stormwatch_train_job_restarts": "gauge",
    "stormwatch_train_steps_total": "counter",
    "stormwatch_train_tokens_total": "counter",
    "stormwatch_collective_calls_total": "counter",
    "stormwatch_collective_bytes_total": "counter",
    "stormwatch_collective_duration_seconds_total": "counter",
}


def _everything_exported(
    start_agent: Any, fake_torchrun: Any, tools: Any, kubelet: KubeletServer
) -> Any:
    """An agent with every collector producing data (on Kubernetes); returns its scrape."""
    fake = FakeNvml(3)
    fake.gpus[2].links = []  # a GPU without NVLink
    for link in fake.gpus[1].links:
        link.throughput_supported = False
    kubelet.pods = [FakePod("ml", "trainer-0", {"main": [("nvidia.com/gpu", [fake.gpus[0].uuid])]})]
    agent = start_agent(fake, pod_resources_socket=kubelet.socket)
    launcher = fake_torchrun([0, 1, 2])
    rank0 = launcher.wait_pid(0)
    launcher.wait_pid(1), launcher.wait_pid(2)
    tools.wait_for(
        lambda: tools.scrape(agent.url).value(
            "stormwatch_rank_last_progress_timestamp_seconds", training_job=launcher.job, rank="1"
        )
    )
    # Each fake rank writes every trainer metric after its first heartbeats: wait for them.
    trainer = {spec.name for spec in load_catalogue() if spec.source == "trainer"}
    tools.wait_for(lambda: trainer <= set(tools.scrape(agent.url).families))
    fake.set_processes(0, [(rank0, 2**30), (6498025472, 9980)])
    fake.emit_xid(0, 48)
    fake.inject_error("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_UNKNOWN, gpu=0)
    for fault_id, rank, ttl in (("a", 1, 600), ("b", 2, 0.1)):
        body = {
            "id": fault_id,
            "kind": "kill_rank",
            "rank": rank,
            "job": launcher.job,
            "ttl_seconds": ttl,
        }
        reply = tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
        assert reply.status in (200, 201), reply.text
    tools.wait_for(
        lambda: (
            tools.http("GET", agent.fault_url + "/v1/faults/b", token=tools.token).json()["state"]
            == "reverted"
        )
    )
    agent.sample()
    return tools.scrape(agent.url)


def test_every_exported_metric_is_in_the_catalogue_with_its_type(
    start_agent: Any, fake_torchrun: Any, tools: Any, kubelet: KubeletServer
) -> None:
    scrape = _everything_exported(start_agent, fake_torchrun, tools, kubelet)
    catalogue = load_catalogue()
    missing = sorted(set(scrape.families) - {spec.name for spec in catalogue})
    assert not missing, f"exported but not in agent/catalogue.csv: {missing}"
    wrong = {
        name: (kind, catalogue[name].type)
        for name, kind in scrape.families.items()
        if catalogue[name].type != kind
    }
    assert not wrong, f"type differs from the catalogue (exported, catalogued): {wrong}"
    for name, labels in scrape.family_labels.items():
        allowed = set(catalogue[name].labels) | (
            {"le"} if catalogue[name].type == "histogram" else set()
        )
        if name.startswith("DCGM_"):  # dcgm-exporter's per-series labels: MIG instance, pod
            allowed |= {"GPU_I_PROFILE", "GPU_I_ID", "namespace", "pod", "container"}
        assert labels <= allowed, f"{name} has labels {labels - allowed} not in the catalogue"
    # And the other way: no catalogue row is dead (every metric appears in this scrape).
    never = sorted({spec.name for spec in catalogue} - set(scrape.families))
    assert not never, f"catalogued but never exported: {never}"
    assert scrape.series("stormwatch_gpu_nvml_errors_total", gpu="0", error="UNKNOWN")


def test_trainer_contract_metrics_are_catalogued() -> None:
    catalogue = load_catalogue()
    for name, kind in TRAINER_CONTRACT.items():
        assert name in catalogue, name
        assert catalogue[name].type == kind, name
        assert {"training_job", "rank"} <= set(catalogue[name].labels), name
        assert catalogue[name].source == "trainer"


def _exposed(spec: trainer_metrics.MetricSpec) -> str:
    """The exposed family name: prometheus-client appends ``_total`` to counters."""
    return spec.name + "_total" if spec.kind == "counter" else spec.name


def test_every_trainer_metric_has_a_catalogue_row_with_its_type_and_labels() -> None:
    """The next trainer metric cannot be forgotten: telemetry/metrics.py is the source."""
    catalogue = load_catalogue()
    assert trainer_metrics.CATALOGUE, "telemetry/metrics.py defines no metrics?"
    missing = sorted(_exposed(s) for s in trainer_metrics.CATALOGUE if _exposed(s) not in catalogue)
    assert not missing, f"trainer metrics without a row in agent/catalogue.csv: {missing}"
    for spec in trainer_metrics.CATALOGUE:
        row = catalogue[_exposed(spec)]
        assert row.type == spec.kind, f"{row.name}: catalogue {row.type}, trainer {spec.kind}"
        assert set(row.labels) == set(spec.labels), f"{row.name}: labels differ"
        assert row.source == "trainer", row.name
    # And no catalogue row claims the trainer as source for a metric it no longer has.
    defined = {_exposed(spec) for spec in trainer_metrics.CATALOGUE}
    stale = sorted(row.name for row in catalogue.by_source("trainer") if row.name not in defined)
    assert not stale, f"catalogue rows for metrics the trainer does not define: {stale}"


#: DCGM fields exported beyond default-counters.csv (dcgm-exporter ships them in its
#: other counter files, e.g. ``dcp-metrics-included.csv``), with their dcgm-exporter type.
DCGM_EXTRA_FIELDS = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "gauge"}


#: dcgm-exporter's own fields it types counter although they go down (windowed counts,
#: health and P2P codes; none is in its default set): exported untyped.
DCGM_EXP_NOT_MONOTONIC = {
    "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_EXP_GPU_HEALTH_STATUS",
    "DCGM_EXP_P2P_STATUS",
}


def test_dcgm_names_keep_dcgm_exporter_types(tools: Any) -> None:
    """Gauges stay gauges and counters counters (named without _total, as dcgm-exporter)."""
    peer = {name: row.type for name, row in tools.dcgm_counters().items()}
    peer.update(DCGM_EXTRA_FIELDS)
    for spec in load_catalogue():
        if spec.name.startswith("DCGM_"):
            assert spec.name in peer, f"{spec.name} is not a dcgm-exporter field"
            expected = "untyped" if spec.name in DCGM_EXP_NOT_MONOTONIC else peer[spec.name]
            assert spec.type == expected, spec.name


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name,type,unit,labels,source,help\nx,gauge,1,,a,h\nx,gauge,1,,a,h\n", "duplicate"),
        ("name,type,unit,labels,source,help\nx,summary,1,,a,h\n", "type"),
        ("name,type,unit,labels,source,help\nbad name,gauge,1,,a,h\n", "name"),
    ],
)
def test_invalid_catalogue_rows_are_rejected_with_the_field(text: str, needle: str) -> None:
    with pytest.raises(AgentError, match=needle):
        parse_catalogue(text)


def test_agent_metrics_command_prints_the_catalogue_in_each_format() -> None:
    runner = CliRunner()
    catalogue = load_catalogue()
    as_csv = runner.invoke(agent_cli, ["metrics", "--format", "csv"])
    assert as_csv.exit_code == 0, as_csv.output
    rows = list(csv.DictReader(io.StringIO(as_csv.output)))
    assert [row["name"] for row in rows] == [spec.name for spec in catalogue]
    assert list(rows[0]) == ["name", "type", "unit", "labels", "source", "help"]
    as_json = runner.invoke(agent_cli, ["metrics", "--format", "json"])
    assert as_json.exit_code == 0
    parsed = json.loads(as_json.output)
    assert {entry["name"]: entry["type"] for entry in parsed}["stormwatch_rank_up"] == "gauge"
    table = runner.invoke(agent_cli, ["metrics"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "DCGM_FI_DEV_GPU_UTIL" in table.output


@pytest.mark.parametrize("columns", [80, 100, 120, 160])
def test_metrics_table_is_one_line_per_metric_and_fits_the_terminal(columns: int) -> None:
    """At 80 columns the old table was 1,788 lines (help folded two letters wide)."""
    catalogue = load_catalogue()
    result = CliRunner().invoke(agent_cli, ["metrics"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) <= len(catalogue) + 4, f"{len(lines)} lines for {len(catalogue)} metrics"
    assert max(len(line) for line in lines) <= columns
    words = {line.split()[0] for line in lines if line.strip()}
    for spec in catalogue:  # names are never cut: they are copied into queries
        assert spec.name in words, spec.name
    header = lines[1].split()
    assert header[:4] == ["name", "type", "unit", "labels"]
    assert ("help" in header) is (columns >= 120)
    rank_up = next(line for line in lines if line.startswith("stormwatch_rank_up "))
    assert rank_up.split()[1:3] == ["gauge", "1"]


def test_metrics_grep_filters_by_name_in_every_format_and_wide_shows_help() -> None:
    runner = CliRunner()
    env = {"COLUMNS": "80"}
    table = runner.invoke(agent_cli, ["metrics", "--grep", "^stormwatch_rank_"], env=env)
    assert table.exit_code == 0, table.output
    names = {line.split()[0] for line in table.output.splitlines()[3:] if line.strip()}
    expected = {spec.name for spec in load_catalogue() if spec.name.startswith("stormwatch_rank_")}
    assert names == expected and expected
    as_csv = runner.invoke(agent_cli, ["metrics", "--grep", "TEMP", "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(as_csv.output)))
    assert rows and all("TEMP" in row["name"] for row in rows)
    as_json = runner.invoke(agent_cli, ["metrics", "--grep", "nomatch-xyz", "--format", "json"])
    assert as_json.exit_code == 0 and json.loads(as_json.stdout) == []
    # Wide enough that no column but help wraps (a wrapped labels cell would interleave).
    wide = runner.invoke(
        agent_cli, ["metrics", "--grep", "^stormwatch_rank_up$", "--wide"], env={"COLUMNS": "200"}
    )
    assert wide.exit_code == 0
    text = " ".join(wide.output.split())
    assert load_catalogue()["stormwatch_rank_up"].help in text and "source" in text
    bad = runner.invoke(agent_cli, ["metrics", "--grep", "("])
    assert bad.exit_code != 0 and "--grep" in str(bad.exception)


@pytest.mark.parametrize(
    ("fmt", "stdout"),
    [("table", ""), ("csv", "name,type,unit,labels,source,help\n"), ("json", "[]\n")],
    ids=["table", "csv", "json"],
)
def test_metrics_grep_that_matches_nothing_says_so_on_stderr(fmt: str, stdout: str) -> None:
    """It printed an empty table (title and header) and nothing else; csv and json stay
    valid for a pipe (a header, []); the exit is 0 as for any listing."""
    argv = ["metrics", "--grep", "zzzz", "--format", fmt]
    result = CliRunner().invoke(agent_cli, argv, env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert result.stdout == stdout
    total = len(load_catalogue())
    assert result.stderr == f"no metric matches 'zzzz' ({total} metrics in the catalogue)\n"


def test_exposition_passes_promtool_except_dcgm_label_case(start_agent: Any, tools: Any) -> None:
    """promtool (Prometheus's own parser and linter) accepts /metrics.

    The only findings allowed are on dcgm-exporter's own series: its camelCase label
    ``modelName``, kept verbatim for its dashboards (``stormwatch_gpu_info`` says
    ``model_name``), its metric names containing "counter"
    (``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``), and its counters named without
    ``_total``, all kept verbatim too; and on node_exporter's netstat names, whose kernel
    field names (``node_netstat_Tcp_RetransSegs``) promtool calls camelCase, kept verbatim
    so rules written for node_exporter read them.
    """
    agent = start_agent(FakeNvml(2))
    text = tools.http("GET", agent.url + "/metrics").text
    status, findings = tools.promtool_check_metrics(text)
    assert status in (0, 3), findings  # 3: lint findings only
    assert findings, "expected the DCGM camelCase finding; did the labels change?"
    for line in findings:
        assert _dcgm_exporters_own(line) or _node_exporters_own(line), line


def _dcgm_exporters_own(finding: str) -> bool:
    """A promtool finding about a name dcgm-exporter chose, kept verbatim so its dashboards
    and rules work: the ``modelName`` label, ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER`` (has "counter"
    in its name), counters without ``_total``. Any other finding is a stormwatch metric's."""
    return finding.startswith("DCGM_") and (
        "camelCase" in finding
        or "should not include type 'counter'" in finding
        or 'should have "_total" suffix' in finding
    )


def _node_exporters_own(finding: str) -> bool:
    """A promtool finding about a node_exporter netstat name: the kernel's own field names
    (``/proc/net/snmp``'s ``RetransSegs``), which node_exporter keeps and so do we."""
    return finding.startswith("node_netstat_") and "camelCase" in finding


#: A training rank using the public telemetry API on a one-rank gloo group: every kind of
#: metric a rank writes (steps, phases, checkpoints, faults, counted collectives), then it
#: stays alive (its gauges live as long as it does).
_TELEMETRY_RANK = """
import sys
import stormwatch.telemetry as swt
from stormwatch.telemetry import StepRecord

swt.init()
session = swt.session()
import torch
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
with swt.phase("checkpoint_load"):
    pass
for step in (1, 2, 3):
    dist.all_reduce(torch.ones(1024))
    dist.broadcast(torch.ones(16), 0)
    swt.step(step, loss=2.0 / step, tokens=4096, samples=8, lr=3e-4, grad_norm=1.5)
session.record_step(StepRecord(step=4, seconds=0.2, loss=0.4, tokens=4096, wait_seconds=0.05,
                               mfu=0.4, peak_flops=1e15, memory={"rss": 2**30}))
session.checkpoint_interval(2)
swt.checkpoint(4)
swt.checkpoint(4, error="disk full")
session.fault("slow_step", 4)
print("ready", flush=True)
sys.stdin.read()
"""


def test_the_training_exposition_passes_promtool_check_metrics(
    start_agent: Any, tools: Any, metrics_dir: Path
) -> None:
    """A rank writing through the telemetry API, served by the agent: promtool finds
    nothing to say about any stormwatch metric. Only dcgm-exporter's and node_exporter's own
    names and labels are exempt (see test_exposition_passes_promtool_except_dcgm_label_case)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STORMWATCH_", "PROMETHEUS_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))
    }
    env.update(
        STORMWATCH_METRICS_DIR=str(metrics_dir),
        STORMWATCH_LOG_DIR=str(metrics_dir.parent / "logs"),
        STORMWATCH_DUMP_DIR=str(metrics_dir.parent / "dumps"),
        STORMWATCH_JOB="promtool",
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        TORCHELASTIC_RUN_ID="promtool",
    )
    agent = start_agent(FakeNvml(1))
    # Families as the text format names them (counters with _total).
    written = {
        "stormwatch_train_step",
        "stormwatch_train_step_duration_seconds",
        "stormwatch_train_phase_deadline_timestamp_seconds",
        "stormwatch_train_checkpoint_failures_total",
        "stormwatch_train_fault_injections_total",
        "stormwatch_collective_calls_total",
        "stormwatch_collective_latency_seconds",
        "stormwatch_collective_algbw_bytes_per_second",
    }
    with subprocess.Popen(
        [sys.executable, "-c", _TELEMETRY_RANK],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as rank:
        try:
            assert rank.stdout is not None and rank.stdout.readline() == "ready\n"
            scrape = tools.wait_for(
                lambda: written <= set((s := tools.scrape(agent.url)).families) and s
            )
        finally:
            rank.communicate("", timeout=60)
    status, findings = tools.promtool_check_metrics(scrape.text)
    assert status in (0, 3), findings  # 3: lint findings only, no parse error
    assert not [
        line for line in findings if not (_dcgm_exporters_own(line) or _node_exporters_own(line))
    ], findings
