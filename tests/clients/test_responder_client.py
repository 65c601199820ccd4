"""The responder client reads the responder's own records and maps its errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from stormwatch.clients import ResponderClient, ResponderClientError
from stormwatch.contracts.responder import ActionRecord, IncidentRecord, NotificationRecord
from stormwatch.errors import ConfigError

TOKEN = "responder-test-token"
MEMBER = {
    "fingerprint": "f1", "alertname": "StormwatchRankStalled", "status": "firing",
    "labels": {"training_job": "train", "rank": "1"}, "annotations": {}, "group_key": "g",
    "starts_at": 100.0, "ends_at": None, "joined_at": 101.0, "resolved_at": None,
}  # fmt: skip
INCIDENT = {
    "id": 1, "group_key": "g", "group_labels": {"alertname": "StormwatchRankStalled"},
    "status": "open", "alertname": "StormwatchRankStalled", "labels": MEMBER["labels"],
    "annotations": {}, "starts_at": 100.0, "ends_at": None, "opened_at": 101.0,
    "closed_at": None, "first_alert": MEMBER, "first_alert_tied": False, "members": [MEMBER],
}  # fmt: skip
ACTION = {
    "id": 7, "incident_id": 1, "kind": "restart_workers", "status": "running",
    "created_at": 101.0, "started_at": 101.5, "finished_at": None, "attempts": 1,
    "detail": "", "data": {},
}  # fmt: skip
NOTIFICATION = {
    "id": 3, "received_at": 101.0, "group_key": "g", "status": "firing",
    "receiver": "stormwatch-responder", "alerts": 1, "new_alerts": 1,
}  # fmt: skip


def _responder(seen: list[tuple[str, str, str | None]]) -> web.Application:
    """The responder's read API and approve endpoint, with its Bearer check."""

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append((request.method, request.path_qs, request.headers.get("Authorization")))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": "missing or invalid bearer token"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    lists = {"incidents": INCIDENT, "actions": ACTION, "notifications": NOTIFICATION}

    async def listing(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return web.json_response({name: [lists[name]]})

    async def approve(request: web.Request) -> web.Response:
        action = int(request.match_info["id"])
        if action != 7:
            return web.json_response({"error": f"no action {action}"}, status=404)
        return web.json_response({"action_id": 7, "approved": True})

    app = web.Application(middlewares=[auth])
    app.router.add_get("/v1/{name}", listing)
    app.router.add_post("/v1/actions/{id}/approve", approve)
    return app


def test_records_are_the_responders_own_models(serve: Any) -> None:
    seen: list[tuple[str, str, str | None]] = []

    async def main() -> tuple[Any, Any, Any]:
        async with serve(_responder(seen)) as url:
            client = ResponderClient(url, token=TOKEN)
            return await asyncio.gather(
                client.incidents(), client.actions(), client.notifications(limit=5)
            )

    incidents, actions, notifications = asyncio.run(main())
    assert incidents == [IncidentRecord.model_validate(INCIDENT)]
    assert actions == [ActionRecord.model_validate(ACTION)]
    assert notifications == [NotificationRecord.model_validate(NOTIFICATION)]
    assert ("GET", "/v1/notifications?limit=5", f"Bearer {TOKEN}") in seen


def test_approve_maps_the_status_and_a_token_file_is_read(serve: Any, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")

    async def main() -> list[int | None]:
        async with serve(_responder([])) as url:
            client = ResponderClient(url, token_file=token_file)
            await client.approve(7, actor="alice")
            statuses = []
            for action, who in ((8, client), (7, ResponderClient(url, token="wrong"))):
                with pytest.raises(ResponderClientError) as raised:
                    await who.approve(action, actor="alice")
                statuses.append(raised.value.status)
            return statuses

    assert asyncio.run(main()) == [404, 401]


def test_an_answer_of_another_shape_or_no_answer_is_a_client_error(serve: Any) -> None:
    async def bad(request: web.Request) -> web.Response:
        return web.json_response({"incidents": [{"id": "not a record"}]})

    app = web.Application()
    app.router.add_get("/v1/incidents", bad)

    async def main() -> None:
        async with serve(app) as url:
            with pytest.raises(ResponderClientError, match="unexpected answer"):
                await ResponderClient(url).incidents()
        with pytest.raises(ResponderClientError, match="failed") as raised:
            await ResponderClient(url, timeout=2).incidents()
        assert raised.value.status is None

    asyncio.run(main())


def test_bad_url_and_both_token_arguments_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="url: 'localhost:19095'"):
        ResponderClient("localhost:19095")
    with pytest.raises(ConfigError, match="bearer_token"):
        ResponderClient("http://127.0.0.1:19095", token="t", token_file=tmp_path / "t")
