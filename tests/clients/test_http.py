"""The clients' shared HTTP options: TLS (CA, client certificate, skip verify), basic auth,
Bearer token (inline or file), extra headers; and the answers that are not Prometheus'."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from stormwatch.clients import (
    AsyncPrometheusClient,
    HttpOptions,
    PrometheusAPIError,
    PrometheusClient,
)
from stormwatch.errors import ConfigError

VECTOR = {
    "status": "success",
    "data": {"resultType": "vector", "result": [{"metric": {"job": "j"}, "value": [1.5, "2"]}]},
}


def _recording_prometheus(seen: list[dict[str, str]], answer: Any = None) -> web.Application:
    """Answers every ``/api/v1/query`` with ``answer`` (default: one sample), noting headers."""

    async def query(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response(VECTOR if answer is None else answer)

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    return app


def test_basic_auth_and_extra_headers_reach_the_server(serve: Any) -> None:
    seen: list[dict[str, str]] = []

    async def main() -> float:
        async with serve(_recording_prometheus(seen)) as url:
            options = HttpOptions(username="prom", password="pw", headers={"X-Scope-OrgID": "t1"})
            [sample] = await AsyncPrometheusClient(url, options=options).query("up")
            return sample.value

    assert asyncio.run(main()) == 2.0
    assert seen[0]["Authorization"] == "Basic cHJvbTpwdw=="  # base64("prom:pw")
    assert seen[0]["X-Scope-OrgID"] == "t1"


def test_bearer_token_file_is_read_on_every_request(serve: Any, tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []
    token = tmp_path / "token"

    async def main() -> None:
        async with serve(_recording_prometheus(seen)) as url:
            token.write_text("first\n")  # it must exist when the options are made
            client = AsyncPrometheusClient(url, options=HttpOptions(bearer_token_file=token))
            await client.query("up")
            token.write_text("rotated\n")
            await client.query("up")
            token.unlink()
            with pytest.raises(PrometheusAPIError, match="cannot read the token file"):
                await client.query("up")

    asyncio.run(main())
    assert [h["Authorization"] for h in seen] == ["Bearer first", "Bearer rotated"]


def test_tls_verifies_the_server_with_the_ca_file_or_skips_when_told(
    serve: Any, tls_pair: tuple[Path, Path]
) -> None:
    cert, key = tls_pair
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)

    async def main() -> None:
        async with serve(_recording_prometheus([]), server) as url:
            assert url.startswith("https://")
            trusted = AsyncPrometheusClient(url, options=HttpOptions(ca_file=cert))
            assert [s.value for s in await trusted.query("up")] == [2.0]
            with pytest.raises(PrometheusAPIError, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
                await AsyncPrometheusClient(url).query("up")
            skip = AsyncPrometheusClient(url, options=HttpOptions(insecure_skip_verify=True))
            assert [s.value for s in await skip.query("up")] == [2.0]

    asyncio.run(main())


def test_client_certificate_for_mutual_tls(serve: Any, tls_pair: tuple[Path, Path]) -> None:
    cert, key = tls_pair
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_verify_locations(cafile=cert)

    async def main() -> None:
        async with serve(_recording_prometheus([]), server) as url:
            mutual = HttpOptions(ca_file=cert, cert_file=cert, key_file=key)
            assert [s.value for s in await AsyncPrometheusClient(url, options=mutual).query("up")]
            with pytest.raises(PrometheusAPIError):
                await AsyncPrometheusClient(url, options=HttpOptions(ca_file=cert)).query("up")

    asyncio.run(main())


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"ca_file": Path("/nonexistent/ca.pem")}, "ca_file"),
        ({"bearer_token_file": Path("/nonexistent/token")}, "bearer_token_file: .* is not a file"),
        ({"key_file": Path(__file__)}, "key_file: needs cert_file"),
        ({"password": "pw"}, "password: needs username"),
        ({"bearer_token": "t", "bearer_token_file": Path(__file__)}, "bearer_token"),
        ({"bearer_token": "t", "username": "u"}, "username"),
        ({"bearer_token": "t", "headers": {"authorization": "x"}}, "headers"),
    ],
)
def test_inconsistent_options_are_a_config_error_naming_the_field(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        HttpOptions(**fields)


@pytest.mark.parametrize("url", ["127.0.0.1:9090", "ftp://host", "http://"])
def test_a_base_url_that_is_not_http_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="prometheus_url"):
        PrometheusClient(url)
    with pytest.raises(ConfigError, match="timeout"):
        PrometheusClient("http://127.0.0.1:9090", timeout=0)


@pytest.mark.parametrize(
    ("answer", "status", "message"),
    [
        (b"<html>bad gateway</html>", 502, "HTTP 502, not a Prometheus answer"),
        (
            b'{"status": "success", "data": {"resultType": "vector", "result": [{}]}}',
            200,
            "malformed",
        ),
        (
            b'{"status": "error", "errorType": "timeout", "error": "too slow"}',
            503,
            "timeout: too slow",
        ),
    ],
)
def test_answers_that_are_not_a_prometheus_result_are_api_errors(
    serve: Any, answer: bytes, status: int, message: str
) -> None:
    async def query(request: web.Request) -> web.Response:
        return web.Response(body=answer, status=status, content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/query", query)

    async def main() -> PrometheusAPIError:
        async with serve(app) as url:
            with pytest.raises(PrometheusAPIError, match=message) as raised:
                await AsyncPrometheusClient(url).query("up")
            return raised.value

    error = asyncio.run(main())
    assert error.status == status


def test_one_session_is_held_inside_async_with_and_closed_after(serve: Any) -> None:
    async def main() -> None:
        async with serve(_recording_prometheus([])) as url:
            client = AsyncPrometheusClient(url)
            async with client:
                session = client._session
                assert session is not None
                await asyncio.gather(client.query("a"), client.query("b"))
                assert client._session is session
            assert session.closed and client._session is None

    asyncio.run(main())
