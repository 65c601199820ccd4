"""Upload dashboards to Grafana's HTTP API (:class:`~stormwatch.clients.GrafanaClient`), idempotently.

For each dashboard: ``GET /api/dashboards/uid/<uid>``; when it is missing it is
created, when its content (ignoring Grafana's ``id`` and ``version``) or folder
differs it is updated (``POST /api/dashboards/db`` with ``overwrite``), otherwise
nothing is sent. The folder is looked up by title (``GET /api/folders``) and
created when missing (``POST /api/folders``, uid derived from the title).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from stormwatch.clients.errors import GrafanaAPIError
from stormwatch.clients.grafana import GrafanaClient
from stormwatch.dashboards.errors import PushError
from stormwatch.dashboards.panels import uid_for

log = logging.getLogger(__name__)

Outcome = Literal["created", "updated", "unchanged"]
_VOLATILE = ("id", "version")


@dataclass(frozen=True)
class PushResult:
    """What a push did to one dashboard."""

    uid: str
    title: str
    outcome: Outcome


def _comparable(dashboard: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in dashboard.items() if k not in _VOLATILE}


async def _folder_uid(api: GrafanaClient, title: str) -> str:
    for folder in await api.folders():
        if folder.get("title") == title:
            return str(folder["uid"])
    created = await api.create_folder(title, uid=uid_for(title))
    log.info("created Grafana folder %r (uid %s)", title, created["uid"])
    return str(created["uid"])


async def _push(
    api: GrafanaClient, dashboards: Mapping[str, Mapping[str, Any]], folder: str | None
) -> list[PushResult]:
    results: list[PushResult] = []
    folder_uid = await _folder_uid(api, folder) if folder else ""
    for uid, dashboard in sorted(dashboards.items()):
        existing = await api.dashboard(uid)
        if existing is not None:
            same_body = _comparable(existing.get("dashboard", {})) == _comparable(dashboard)
            same_folder = existing.get("meta", {}).get("folderUid", "") == folder_uid
            if same_body and same_folder:
                results.append(PushResult(uid, str(dashboard["title"]), "unchanged"))
                continue
        body: dict[str, Any] = {
            "dashboard": {**_comparable(dashboard), "id": None},
            "overwrite": True,
            "message": "stormwatch dashboards push",
        }
        if folder_uid:
            body["folderUid"] = folder_uid
        await api.save_dashboard(body)
        outcome: Outcome = "created" if existing is None else "updated"
        results.append(PushResult(uid, str(dashboard["title"]), outcome))
    return results


def push(
    url: str,
    token: str,
    dashboards: Mapping[str, Mapping[str, Any]],
    *,
    folder: str | None = None,
    timeout: float = 10.0,
) -> list[PushResult]:
    """Create or update ``dashboards`` ({uid: JSON}) on the Grafana at ``url``.

    Args:
        url: Grafana's base URL (``http://host:3000``).
        token: a service-account token (sent as ``Authorization: Bearer``).
        folder: folder title; None keeps the General folder.
        timeout: seconds per HTTP request.

    Returns:
        One :class:`PushResult` per dashboard, in uid order.

    Raises:
        PushError: Grafana refused a request or could not be reached.
    """

    async def run() -> list[PushResult]:
        api = GrafanaClient(url, token=token, timeout=timeout)
        async with api:
            return await _push(api, dashboards, folder)

    try:
        return asyncio.run(run())
    except GrafanaAPIError as exc:
        if exc.status is None:
            raise PushError(f"cannot reach Grafana at {url}: {exc}") from exc
        raise PushError(f"Grafana at {url} refused the request: {exc}") from exc
