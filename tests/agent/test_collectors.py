"""A failing collector costs only its own metrics; /metrics never fails as a whole."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from stormwatch.agent import AgentConfig, AgentConfigError
from stormwatch.agent.collectors import CollectorSet, HostCollector, new_family


class _Exploding:
    """Stands in for a broken third-party data source."""

    name = "exploding"

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("partial_metric", "yielded before the failure", value=1)
        raise RuntimeError("device vanished")


def test_raising_collector_yields_up_0_and_others_still_export() -> None:
    collectors = CollectorSet([_Exploding(), HostCollector()])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collectors)
    for expected_errors in (1, 2):
        text = generate_latest(registry).decode()
        assert 'stormwatch_collector_up{collector="exploding"} 0.0' in text
        assert (
            f'stormwatch_collector_errors_total{{collector="exploding"}} {expected_errors}.0'
            in text
        )
        assert 'stormwatch_collector_up{collector="host"} 1.0' in text
        assert "stormwatch_host_memory_total_bytes" in text
        assert "partial_metric" not in text  # all or nothing per collector
    assert collectors.health() == {"exploding": False, "host": True}


def test_unrenderable_family_is_caught_inside_the_guard() -> None:
    class Bad:
        name = "bad"

        def collect(self) -> Iterator[Metric]:
            family = new_family("stormwatch_gpu_up")
            family.add_metric(["0"], object())
            yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(CollectorSet([Bad(), HostCollector()]))
    text = generate_latest(registry).decode()
    assert 'stormwatch_collector_up{collector="bad"} 0.0' in text
    assert "stormwatch_host_cpu_utilization_ratio" in text


def test_uncatalogued_metric_cannot_be_created() -> None:
    with pytest.raises(KeyError):
        new_family("stormwatch_not_in_the_catalogue")


def test_corrupt_trainer_file_takes_down_only_the_trainer_collector(
    start_agent: Any, tools: Any, metrics_dir: Path
) -> None:
    agent = start_agent()
    (metrics_dir / "counter_999999.db").write_bytes(b"\x10\x00\x00\x00garbage-not-an-mmap-dict")
    # Within one render of the cached exposition (at most 1 s); every scrape answers 200.
    scrape = tools.wait_for(
        lambda: (
            (s := tools.scrape(agent.url)).value("stormwatch_collector_up", collector="trainer")
            == 0
            and s
        )
    )
    assert scrape.value("stormwatch_collector_errors_total", collector="trainer") >= 1
    assert scrape.value("stormwatch_collector_up", collector="gpu") == 1
    assert scrape.value("DCGM_FI_DEV_GPU_TEMP", gpu="0") is not None
    assert tools.http("GET", agent.url + "/healthz").json()["collectors"]["trainer"] is False
    (metrics_dir / "counter_999999.db").unlink()
    tools.wait_for(
        lambda: tools.scrape(agent.url).value("stormwatch_collector_up", collector="trainer") == 1
    )


def test_every_collector_can_be_switched_off(start_agent: Any, tools: Any) -> None:
    from stormwatch.agent import COLLECTOR_NAMES

    agent = start_agent(disabled_collectors=frozenset(COLLECTOR_NAMES))
    scrape = tools.scrape(agent.url)
    assert scrape.series("stormwatch_collector_up") == []
    assert (
        scrape.value("stormwatch_agent_info", gpu_backend="none", node="node-test", version="0.1.0")
        == 1
    )
    assert agent.agent.sampler is None


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"sample_interval": 0}, "sample_interval"),
        ({"disabled_collectors": frozenset({"gpux"})}, "disabled_collectors"),
        ({"node": "has space"}, "node"),
        ({"gpu_backend": "cuda"}, "gpu_backend"),
        ({"listen_port": 70000}, "listen_port"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_config_errors_name_the_field(tmp_path: Path, values: dict[str, Any], field: str) -> None:
    with pytest.raises(AgentConfigError, match=field):
        AgentConfig.build(metrics_dir=tmp_path, **values)


def test_the_trainer_collector_leaves_out_labels_it_cannot_encode(tmp_path: Path) -> None:
    """A rank that wrote a job name with lone surrogates must not take every job's
    metrics on the node down with it (real prometheus-client multiprocess files)."""
    import subprocess
    import sys

    from stormwatch.agent.collectors.base import CollectorSet
    from stormwatch.agent.collectors.trainer import TrainerCollector
    from stormwatch.agent.watch.folder import TrainerFolder

    code = (
        "import sys\nfrom prometheus_client import Gauge\n"
        "Gauge('g', 'g', ['training_job'], multiprocess_mode='livemax').labels(training_job=sys.argv[1]).set(1)\n"
    )
    environ = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for job in ("good", "bad\udcff"):
        subprocess.run([sys.executable, "-c", code, job], env=environ, check=True, timeout=60)
    collector = TrainerCollector(TrainerFolder(tmp_path))
    text = CollectorSet([collector]).render().decode()
    assert 'g{training_job="good"} 1.0' in text
    assert 'stormwatch_collector_up{collector="trainer"} 1.0' in text
    assert collector.unencodable == 1
