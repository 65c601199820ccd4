"""The one http(s) URL check (stormwatch.urls): what every URL setting accepts."""

from __future__ import annotations

import pytest

from stormwatch.urls import is_http_url


@pytest.mark.parametrize(
    "url",
    ["http://prometheus.example:9090", "https://10.0.0.1/prom/", "http://[::1]:9090"],
)
def test_an_http_url_with_a_host_is_accepted(url: str) -> None:
    assert is_http_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "prometheus:9090",
        "ftp://host",
        "http://",
        "http://[::1",
        "http://host:99999",
        "http://prom example:9090",
        "http://host:9090/a b",
        "http://host\t:9090",
        "http://host\n",
    ],
)
def test_a_url_without_a_host_or_with_spaces_is_refused(url: str) -> None:
    assert not is_http_url(url)
