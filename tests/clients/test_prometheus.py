"""The Prometheus HTTP API client against a real Prometheus on a loopback port."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from stormwatch.clients import (
    AsyncPrometheusClient,
    PrometheusAPI,
    PrometheusAPIError,
    PrometheusClient,
)

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="needs the prometheus binary (apt-get install prometheus)",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus_url(
    tmp_path_factory: pytest.TempPathFactory, prometheus_with_rules: Any
) -> Iterator[str]:
    """A Prometheus evaluating one always-firing alert every second."""
    rule = {
        "alert": "AlwaysFiring",
        "expr": "vector(42)",
        "labels": {"severity": "test"},
        "annotations": {"summary": "always"},
    }
    with prometheus_with_rules(tmp_path_factory.mktemp("prom"), [rule]) as url:
        client = PrometheusClient(url)
        deadline = time.monotonic() + 30
        while not any(a.state == "firing" for a in client.alerts()):
            assert time.monotonic() < deadline, "Prometheus did not evaluate the rule"
            time.sleep(0.2)
        yield url


def test_instant_query_returns_samples(prometheus_url: str) -> None:
    api: PrometheusAPI = PrometheusClient(prometheus_url)
    samples = api.query('label_replace(vector(7), "node", "node0", "", "")')
    assert len(samples) == 1
    assert samples[0].value == 7.0
    assert samples[0].labels == {"node": "node0"}
    assert abs(samples[0].timestamp - time.time()) < 60


def test_scalar_and_empty_results(prometheus_url: str) -> None:
    client = PrometheusClient(prometheus_url)
    assert [s.value for s in client.query("scalar(vector(3))")] == [3.0]
    assert client.query("no_such_metric_anywhere") == []


def test_query_at_a_past_time(prometheus_url: str) -> None:
    client = PrometheusClient(prometheus_url)
    at = time.time() - 10
    [sample] = client.query("time()", at=at)
    assert sample.value == pytest.approx(at, abs=0.01)


def test_range_query_returns_points_in_order(prometheus_url: str) -> None:
    client = PrometheusClient(prometheus_url)
    end = time.time()
    [series] = client.query_range("vector(1)", start=end - 10, end=end, step=2)
    times = [t for t, _ in series.points]
    assert times == sorted(times) and len(times) == 6
    assert {v for _, v in series.points} == {1.0}


def test_alerts_lists_firing_alerts(prometheus_url: str) -> None:
    alerts = PrometheusClient(prometheus_url).alerts()
    [alert] = [a for a in alerts if a.name == "AlwaysFiring"]
    assert alert.state == "firing"
    assert alert.labels["severity"] == "test"
    assert alert.annotations == {"summary": "always"}
    assert alert.value == 42.0
    assert alert.active_at is not None and alert.active_at <= time.time()


def test_bad_expression_is_an_api_error_with_prometheus_reason(prometheus_url: str) -> None:
    with pytest.raises(PrometheusAPIError, match="bad_data"):
        PrometheusClient(prometheus_url).query("sum(")


def test_range_vector_in_instant_query_says_what_to_do(prometheus_url: str) -> None:
    with pytest.raises(PrometheusAPIError, match="query_range"):
        PrometheusClient(prometheus_url).query("up[1m]")


def test_unreachable_prometheus_is_an_api_error() -> None:
    with pytest.raises(PrometheusAPIError, match=r"GET http://127\.0\.0\.1"):
        PrometheusClient(f"http://127.0.0.1:{_free_port()}", timeout=2).query("up")


def test_async_client_and_sync_client_inside_a_running_loop(prometheus_url: str) -> None:
    async def main() -> tuple[float, float]:
        async_value = (await AsyncPrometheusClient(prometheus_url).query("vector(5)"))[0].value
        # The blocking client still works when called from inside an event loop.
        sync_value = PrometheusClient(prometheus_url).query("vector(6)")[0].value
        return async_value, sync_value

    assert asyncio.run(main()) == (5.0, 6.0)


def test_targets_are_listed_with_health(prometheus_url: str) -> None:
    client = PrometheusClient(prometheus_url)
    deadline = time.monotonic() + 30
    while True:
        targets = client.targets()
        if targets and targets[0].health == "up":
            break
        assert time.monotonic() < deadline, targets
        time.sleep(0.5)
    assert targets[0].labels["job"] == "prometheus"
    assert targets[0].scrape_url.endswith("/metrics")


def test_label_values_of_matching_series(prometheus_url: str) -> None:
    client = PrometheusClient(prometheus_url)
    deadline = time.monotonic() + 30
    while "prometheus" not in client.label_values("job"):
        assert time.monotonic() < deadline, "Prometheus did not scrape itself"
        time.sleep(0.5)
    assert client.label_values("job", match=['up{job="prometheus"}']) == ["prometheus"]
    assert client.label_values("job", match=['up{job="nobody"}']) == []
