"""``alerts serve --target``: the target file's Prometheus reaches the responder with its
``prometheus.http`` (TLS, auth), and ``--platform`` / ``--platform-config`` given with
``--target`` are refused (exit 2) before either file is read."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from stormwatch.alerts import cli as alerts_cli
from stormwatch.alerts.responder.settings import ResponderSettings
from stormwatch.cli import main

TARGET = """\
platform: slurm
prometheus:
  url: {url}
  http: {{bearer_token_file: prometheus.token}}
job:
  attach: {{name: llm}}
"""


def _files(tmp_path: Path, url: str = "http://127.0.0.1:9") -> list[str]:
    (tmp_path / "prometheus.token").write_text("s3cret\n")
    (tmp_path / "responder.token").write_text("r\n")
    target = tmp_path / "target.yaml"
    target.write_text(TARGET.format(url=url))
    db = tmp_path / "db.sqlite"
    return ["--db", str(db), "--token-file", str(tmp_path / "responder.token"),
            "--target", str(target)]  # fmt: skip


def _stormwatch(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out = capsys.readouterr()
    return int(exited.value.code or 0), out.out + out.err


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--platform", "lab"], "--platform would"),
        (["--platform", "slurm"], "--platform would"),
        (["--platform-config", "PLATFORM"], "--platform-config would"),
    ],
)
def test_serve_refuses_platform_options_given_with_a_target_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], named: str
) -> None:
    platform_config = tmp_path / "platform.yaml"
    platform_config.write_text("colour: red\n")  # its key error must not be what is reported
    extra = [str(platform_config) if e == "PLATFORM" else e for e in extra]
    code, output = _stormwatch(["alerts", "serve", *_files(tmp_path), *extra], capsys)
    assert code == 2, output
    assert named in output and "give either --target or --platform/--platform-config" in output
    assert "colour" not in output and "Traceback" not in output
    assert not (tmp_path / "db.sqlite").exists()


def test_serve_gives_the_responder_the_target_files_prometheus_http(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, str]] = []

    async def query(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": []}}
        )

    captured: list[ResponderSettings] = []

    async def record(settings: ResponderSettings, **_: Any) -> None:
        """Stands in for the server: this test is about what serve is given."""
        captured.append(settings)

    monkeypatch.setattr(alerts_cli, "serve", record)

    code, output = _stormwatch(["alerts", "serve", *_files(tmp_path)], capsys)
    assert code == 0, output
    [settings] = captured
    assert settings.platform == "slurm" and settings.prometheus_url == "http://127.0.0.1:9"

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/api/v1/query", query)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            here = dataclasses.replace(settings, prometheus_url=f"http://{host}:{port}")
            async with here.prometheus_client() as client:
                await client.query("vector(1)")
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
    assert [h.get("Authorization") for h in seen] == ["Bearer s3cret"]
