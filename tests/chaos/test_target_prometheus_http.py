"""A target file's ``prometheus.http`` (TLS, auth) reaches the chaos side's Prometheus
client: the runner's Target carries it and the post-mortem evidence queries send it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from stormwatch.chaos.platform_target import slurm_target
from stormwatch.chaos.reports.evidence import collect_evidence
from stormwatch.platforms import load_target_file
from stormwatch.platforms.slurm import SlurmCommands

TARGET = """\
platform: slurm
prometheus:
  url: URL
  http: {bearer_token_file: prometheus.token}
job: {attach: {name: llm}}
"""


class _FakeSlurm(SlurmCommands):
    """Answers the commands a slurm target runs, for job 42 (llm) on gpu1."""

    def __call__(self, argv: Sequence[str]) -> str:
        text = " ".join(argv)
        if text.startswith("squeue"):
            return "42|gpu1\n"
        if text.startswith("scontrol show hostnames"):
            return "gpu1\n"
        raise AssertionError(text)


def test_the_post_mortem_evidence_queries_send_the_target_files_token(tmp_path: Path) -> None:
    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response(
            {"status": "success", "data": {"resultType": "matrix", "result": []}}
        )

    async def alerts(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"status": "success", "data": {"alerts": []}})

    async def scenario() -> None:
        app = web.Application()
        app.router.add_route("*", "/api/v1/query_range", answer)
        app.router.add_get("/api/v1/alerts", alerts)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            (tmp_path / "prometheus.token").write_text("s3cret\n")
            path = tmp_path / "target.yaml"
            path.write_text(TARGET.replace("URL", f"http://{host}:{port}"))
            target = slurm_target(load_target_file(path), tmp_path, commands=_FakeSlurm())
            evidence = await collect_evidence(
                window_start=time.time() - 60,
                prometheus_url=target.prometheus_url,
                prometheus_http=target.prometheus_http,
                responder_url=None,
            )
            assert evidence.prometheus_error is None, evidence.prometheus_error
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
    assert seen and set(seen) == {"Bearer s3cret"}
