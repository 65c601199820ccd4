"""Series for series, the agent exports what dcgm-exporter exports for its default counters.

The expected exposition is derived from dcgm-exporter itself: its
``default-counters.csv`` (the enabled rows: name and Prometheus type; the
``label`` rows become labels of every series) and its GPU template
(``internal/pkg/rendermetrics/render_metrics.go`` in releases up to 4.5.3-4.8.2:
``gpu, UUID, pci_bus_id, device, modelName, Hostname``, then the label fields,
then the pod mapper's ``namespace, pod, container`` on a GPU a container holds).
"""

from __future__ import annotations

import gzip
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families

from stormwatch.agent import FakeNvml
from stormwatch.agent.gpu.mig import profile_name
from stormwatch.agent.kube.testing import FakePod, KubeletServer

#: dcgm-exporter's GPU template labels (render_metrics.go, gpuMetricsFormat).
TEMPLATE_LABELS = frozenset({"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"})
POD_LABELS = frozenset({"namespace", "pod", "container"})
MIG_LABELS = frozenset({"GPU_I_PROFILE", "GPU_I_ID"})


def _expected(tools: Any, fake: FakeNvml, pods: dict[int, tuple[str, str, str]]) -> dict:
    """(name, gpu) -> (type, label set, pod label values) that dcgm-exporter would expose."""
    rows = {n: r for n, r in tools.dcgm_counters().items() if r.enabled}
    label_fields = frozenset(n for n, r in rows.items() if r.type == "label")
    assert label_fields == {"DCGM_FI_DRIVER_VERSION"}, "the peer file's label rows changed"
    out = {}
    for name, row in rows.items():
        if row.type == "label":
            continue
        for gpu in fake.gpus:
            held = gpu.index in pods
            labels = TEMPLATE_LABELS | label_fields | (POD_LABELS if held else frozenset())
            out[(name, str(gpu.index))] = (row.type, labels, pods.get(gpu.index))
    return out


def test_exposition_matches_dcgm_exporter_default_set_series_for_series(
    start_agent: Any, tools: Any, kubelet: KubeletServer
) -> None:
    fake = FakeNvml(3)
    fake.emit_xid(2, 31)
    kubelet.pods = [
        # By UUID (the device plugin's default) and by device name (DEVICE_ID_STRATEGY=index).
        FakePod("ml", "llama-0", {"trainer": [("nvidia.com/gpu", [fake.gpus[0].uuid])]}),
        FakePod("ml", "llama-1", {"trainer": [("nvidia.com/gpu", ["nvidia1"])]}),
        FakePod("web", "nginx", {"nginx": [("example.com/nic", ["eth1"])]}),
    ]
    agent = start_agent(fake, pod_resources_socket=kubelet.socket)
    agent.sample()
    scrape = tools.scrape(agent.url)
    pods = {0: ("ml", "llama-0", "trainer"), 1: ("ml", "llama-1", "trainer")}
    expected = _expected(tools, fake, pods)
    assert len(expected) == 3 * 25  # 25 enabled fields in the peer file
    for (name, gpu), (kind, labels, pod) in expected.items():
        assert scrape.families.get(name) == kind, f"{name}: type {scrape.families.get(name)}"
        series = scrape.series(name, gpu=gpu)
        assert len(series) == 1, f"{name}{{gpu={gpu}}}: {len(series)} series"
        (got, _), *_ = series
        assert set(got) == labels, (name, gpu, set(got) ^ labels)
        assert got["device"] == f"nvidia{gpu}" and got["UUID"] == fake.gpus[int(gpu)].uuid
        assert got["DCGM_FI_DRIVER_VERSION"] == fake.driver_version
        if pod is not None:
            assert (got["namespace"], got["pod"], got["container"]) == pod
    # The text format types counters under dcgm-exporter's names (no _total).
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in scrape.text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in scrape.text
    # GPU 2 is held by no container: said by a metric, not by blank labels.
    assert scrape.value("stormwatch_gpu_pod_attributed", gpu="2", GPU_I_ID="") == 0
    assert scrape.value("stormwatch_gpu_pod_attributed", gpu="0", GPU_I_ID="") == 1
    assert scrape.value("stormwatch_kubelet_pod_resources_up") == 1
    assert 'pod=""' not in scrape.text and 'namespace=""' not in scrape.text


def test_an_unreachable_kubelet_attributes_nothing_and_says_so(
    start_agent: Any, tools: Any, kubelet: KubeletServer
) -> None:
    fake = FakeNvml(1)
    kubelet.pods = [FakePod("ml", "a", {"c": [("nvidia.com/gpu", [fake.gpus[0].uuid])]})]
    kubelet.available = False
    agent = start_agent(fake, pod_resources_socket=kubelet.socket)
    scrape = tools.scrape(agent.url)
    assert kubelet.calls >= 1
    assert scrape.value("stormwatch_kubelet_pod_resources_up") == 0
    assert scrape.value("stormwatch_gpu_pod_attributed", gpu="0", GPU_I_ID="") == 0
    (labels, _), *_ = scrape.series("DCGM_FI_DEV_GPU_TEMP", gpu="0")
    assert not POD_LABELS & set(labels)
    kubelet.available = True
    tools.wait_for(
        lambda: tools.scrape(agent.url).value("stormwatch_kubelet_pod_resources_up") == 1
    )
    (labels, _), *_ = tools.scrape(agent.url).series("DCGM_FI_DEV_GPU_TEMP", gpu="0")
    assert labels["pod"] == "a"


def test_openmetrics_and_gzip_are_negotiated_through_prometheus_client(
    start_agent: Any, tools: Any
) -> None:
    agent = start_agent(FakeNvml(1))
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    reply = tools.http(
        "GET", agent.url + "/metrics", headers={"Accept": accept, "Accept-Encoding": "gzip"}
    )
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    body = reply.body
    if reply.headers.get("Content-Encoding") == "gzip":  # urllib does not decompress
        body = gzip.decompress(body)
    else:
        raise AssertionError(f"not gzipped: {reply.headers}")
    families = {f.name: f for f in om_families(body.decode())}  # strict: raises on any error
    # OpenMetrics has no counter without _total: dcgm-exporter's counters are unknown there.
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "unknown"
    assert families["stormwatch_collector_errors"].type == "counter"
    plain = tools.http("GET", agent.url + "/metrics")
    assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "Content-Encoding" not in plain.headers
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in plain.text
    # q=0 refuses a coding (RFC 9110, 12.5.3); prometheus-client's gzip_accepted ignored it.
    for refusing in ("gzip;q=0", "deflate, gzip;q=0.0", "gzip; q=0, *", "gzip;q=-1"):
        reply = tools.http("GET", agent.url + "/metrics", headers={"Accept-Encoding": refusing})
        assert "Content-Encoding" not in reply.headers, refusing
        assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in reply.text
    reply = tools.http("GET", agent.url + "/metrics", headers={"Accept-Encoding": "br, GZIP;q=0.5"})
    assert reply.headers.get("Content-Encoding") == "gzip"


def test_a_mig_gpu_is_exported_per_instance_with_dcgm_exporters_mig_labels(
    start_agent: Any, tools: Any, kubelet: KubeletServer
) -> None:
    fake = FakeNvml(2)
    small, _medium, large = fake.set_mig(0, [(1, 9856), (2, 20096), (3, 40320)])
    large.unsupported.add("nvmlDeviceGetMemoryInfo")  # this instance cannot say its memory
    kubelet.pods = [
        FakePod("ml", "tiny", {"c": [("nvidia.com/mig-1g.10gb", [small.uuid])]}),
    ]
    agent = start_agent(fake, pod_resources_socket=kubelet.socket)
    agent.sample()
    scrape = tools.scrape(agent.url)
    base = TEMPLATE_LABELS | {"DCGM_FI_DRIVER_VERSION"}
    used = {
        labels["GPU_I_ID"]: (labels, value)
        for labels, value in scrape.series("DCGM_FI_DEV_FB_USED", gpu="0")
    }
    # The unsupported instance's framebuffer series is absent, never 0.
    assert sorted(used) == ["1", "2"]
    small_labels, small_used = used["1"]
    assert set(small_labels) == base | MIG_LABELS | POD_LABELS
    assert small_labels["GPU_I_PROFILE"] == "1g.10gb" and small_labels["pod"] == "tiny"
    assert small_labels["UUID"] == fake.gpus[0].uuid and small_labels["device"] == "nvidia0"
    assert 0 < small_used < 9856
    assert set(used["2"][0]) == base | MIG_LABELS and used["2"][0]["GPU_I_PROFILE"] == "2g.20gb"
    # Whole-GPU readings are repeated per instance; utilisation (NOT_SUPPORTED) is absent.
    temps = scrape.series("DCGM_FI_DEV_GPU_TEMP", gpu="0")
    assert sorted(labels["GPU_I_ID"] for labels, _ in temps) == ["1", "2", "3"]
    assert {labels["GPU_I_PROFILE"] for labels, _ in temps} == {"1g.10gb", "2g.20gb", "3g.40gb"}
    assert scrape.series("DCGM_FI_DEV_GPU_UTIL", gpu="0") == []
    assert scrape.value("stormwatch_gpu_pod_attributed", gpu="0", GPU_I_ID="1") == 1
    assert scrape.value("stormwatch_gpu_pod_attributed", gpu="0", GPU_I_ID="3") == 0
    # The GPU without MIG keeps its whole-GPU series, without MIG labels.
    ((labels, _),) = scrape.series("DCGM_FI_DEV_FB_USED", gpu="1")
    assert set(labels) == base
    assert scrape.series("DCGM_FI_DEV_GPU_UTIL", gpu="1")


@pytest.mark.parametrize(
    ("gi", "ci", "memory_mb", "device_gib", "name"),
    [
        (1, 1, 9856, 80, "1g.10gb"),  # H100 80GB
        (3, 3, 40320, 80, "3g.40gb"),
        (7, 7, 80880, 80, "7g.80gb"),
        (1, 1, 4864, 40, "1g.5gb"),  # A100 40GB
        (2, 1, 9984, 40, "1c.2g.10gb"),  # a compute instance smaller than its GPU instance
        (1, 1, 16384, 141, "1g.18gb"),  # H200 141GB
        (3, 3, 71424, 141, "3g.71gb"),  # 70.5 GiB: Go's math.Round rounds half away from 0
    ],
)
def test_mig_profile_names_follow_nvidias_naming(
    gi: int, ci: int, memory_mb: int, device_gib: int, name: str
) -> None:
    assert profile_name(gi, ci, memory_mb, device_gib * 1024**3 - 300 * 1024**2) == name
