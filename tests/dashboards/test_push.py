"""``stormwatch dashboards push`` against a stand-in for Grafana's HTTP API on loopback.

The stand-in (aiohttp) implements the endpoints grafana-client calls for a push
and checks each request against Grafana's documented HTTP API
(grafana.com/docs/grafana/latest/developers/http_api/dashboard/ and .../folder/):
Bearer token, JSON bodies, ``POST /api/dashboards/db`` with ``dashboard.uid``,
``dashboard.id`` null, ``overwrite`` and ``folderUid``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner

from stormwatch.cli import root
from stormwatch.dashboards import PushError, build_all, push

TOKEN = "glsa_test-token"


class FakeGrafana:
    """Grafana's folder and dashboard endpoints, in memory; records every request."""

    def __init__(self) -> None:
        self.folders: list[dict[str, Any]] = []
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.problems: list[str] = []
        self.url = ""
        app = web.Application(middlewares=[self._check_auth])
        app.router.add_get("/api/search", self.search)
        app.router.add_get("/api/folders", self.list_folders)
        app.router.add_post("/api/folders", self.create_folder)
        app.router.add_get("/api/dashboards/uid/{uid}", self.get_dashboard)
        app.router.add_post("/api/dashboards/db", self.save_dashboard)
        self.app = app

    @web.middleware
    async def _check_auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"message": "Unauthorized"}, status=401)
        if request.method == "POST" and request.content_type != "application/json":
            self.problems.append(f"{request.path}: Content-Type {request.content_type}")
            return web.json_response({"message": "bad content type"}, status=415)
        response: web.StreamResponse = await handler(request)
        return response

    async def search(self, request: web.Request) -> web.Response:
        hits = [
            {"uid": uid, "title": d["dashboard"]["title"], "type": "dash-db"}
            for uid, d in self.dashboards.items()
        ]
        return web.json_response(hits)

    async def list_folders(self, request: web.Request) -> web.Response:
        return web.json_response(
            [{"id": f["id"], "uid": f["uid"], "title": f["title"]} for f in self.folders]
        )

    async def create_folder(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body.get("title"), str) or set(body) - {"title", "uid", "parentUid"}:
            self.problems.append(f"POST /api/folders body {body}")
            return web.json_response({"message": "bad request"}, status=400)
        if any(f["title"] == body["title"] for f in self.folders):
            return web.json_response({"message": "folder exists"}, status=409)
        folder = {"id": len(self.folders) + 1, "uid": body.get("uid", "f"), "title": body["title"]}
        self.folders.append(folder)
        return web.json_response({**folder, "url": f"/dashboards/f/{folder['uid']}/", "version": 1})

    async def get_dashboard(self, request: web.Request) -> web.Response:
        stored = self.dashboards.get(request.match_info["uid"])
        if stored is None:
            return web.json_response({"message": "Dashboard not found"}, status=404)
        return web.json_response(stored)

    async def save_dashboard(self, request: web.Request) -> web.Response:
        body = await request.json()
        dashboard = body.get("dashboard")
        if (
            not isinstance(dashboard, dict)
            or not dashboard.get("uid")
            or not dashboard.get("title")
        ):
            self.problems.append(f"POST /api/dashboards/db without dashboard.uid/title: {body}")
            return web.json_response({"message": "bad request"}, status=400)
        if dashboard.get("id") is not None or body.get("overwrite") is not True:
            self.problems.append("POST /api/dashboards/db must send id null and overwrite true")
        folder_uid = body.get("folderUid", "")
        if folder_uid and folder_uid not in {f["uid"] for f in self.folders}:
            return web.json_response({"message": "folder not found"}, status=400)
        uid = dashboard["uid"]
        previous = self.dashboards.get(uid)
        version = previous["dashboard"]["version"] + 1 if previous else 1
        number = previous["dashboard"]["id"] if previous else len(self.dashboards) + 1
        self.dashboards[uid] = {
            "dashboard": {**dashboard, "id": number, "version": version},
            "meta": {"folderUid": folder_uid, "slug": uid, "version": version},
        }
        return web.json_response(
            {
                "id": number,
                "uid": uid,
                "url": f"/d/{uid}/{uid}",
                "status": "success",
                "version": version,
                "slug": uid,
            }
        )


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(fake.app)
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        fake.url = f"http://127.0.0.1:{port}"
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield fake
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    assert not fake.problems, fake.problems


def _push_cli(url: str, *extra: str, token: str | None = TOKEN) -> Any:
    env = {"GRAFANA_TOKEN": token} if token is not None else {"GRAFANA_TOKEN": ""}
    return CliRunner().invoke(root, ["dashboards", "push", "--url", url, *extra], env=env)


def test_push_creates_then_reports_unchanged(grafana: FakeGrafana) -> None:
    dashboards = build_all()
    first = push(grafana.url, TOKEN, dashboards, folder="Stormwatch")
    assert {r.uid: r.outcome for r in first} == dict.fromkeys(dashboards, "created")
    assert [f["title"] for f in grafana.folders] == ["Stormwatch"]
    stored = grafana.dashboards["stormwatch-training"]
    assert stored["meta"]["folderUid"] == grafana.folders[0]["uid"]
    assert stored["dashboard"]["panels"] == dashboards["stormwatch-training"]["panels"]

    grafana.requests.clear()
    second = push(grafana.url, TOKEN, dashboards, folder="Stormwatch")
    assert {r.uid: r.outcome for r in second} == dict.fromkeys(dashboards, "unchanged")
    assert all(method == "GET" for method, _ in grafana.requests), grafana.requests
    assert len(grafana.folders) == 1


def test_push_updates_what_changed(grafana: FakeGrafana) -> None:
    dashboards = build_all()
    push(grafana.url, TOKEN, dashboards)
    grafana.dashboards["stormwatch-incidents"]["dashboard"]["title"] = "edited in the UI"
    results = {r.uid: r.outcome for r in push(grafana.url, TOKEN, dashboards)}
    assert results.pop("stormwatch-incidents") == "updated"
    assert set(results.values()) == {"unchanged"}
    assert grafana.dashboards["stormwatch-incidents"]["dashboard"]["version"] == 2
    # Moving to a folder is a change too.
    moved = {r.outcome for r in push(grafana.url, TOKEN, dashboards, folder="Stormwatch")}
    assert moved == {"updated"}


def test_push_cli_prints_outcomes(grafana: FakeGrafana) -> None:
    result = _push_cli(grafana.url, "--folder", "Stormwatch")
    assert result.exit_code == 0, result.output
    assert result.output.count("created") == 5
    again = _push_cli(grafana.url, "--folder", "Stormwatch")
    assert again.exit_code == 0, again.output
    assert again.output.count("unchanged") == 5


def test_missing_token_names_the_variable(grafana: FakeGrafana) -> None:
    result = _push_cli(grafana.url, token=None)
    assert result.exit_code != 0
    assert "GRAFANA_TOKEN" in str(result.exception)
    assert grafana.requests == []


def test_wrong_token_is_a_push_error(grafana: FakeGrafana) -> None:
    with pytest.raises(PushError, match="refused"):
        push(grafana.url, "wrong", build_all())


def test_unreachable_grafana_is_a_push_error(grafana: FakeGrafana) -> None:
    with pytest.raises(PushError, match="cannot reach"):
        push("http://127.0.0.1:9", TOKEN, build_all(), timeout=2)
