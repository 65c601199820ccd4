"""Upload dashboards to Grafana's HTTP API through grafana-client, idempotently.

For each dashboard: ``GET /api/dashboards/uid/<uid>``; when it is missing it is
created, when its content (ignoring Grafana's ``id`` and ``version``) or folder
differs it is updated (``POST /api/dashboards/db`` with ``overwrite``), otherwise
nothing is sent. The folder is looked up by title (``GET /api/folders``) and
created when missing (``POST /api/folders``, uid derived from the title).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException

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


def _folder_uid(api: GrafanaApi, title: str) -> str:
    for folder in api.folder.get_all_folders():
        if folder.get("title") == title:
            return str(folder["uid"])
    created = api.folder.create_folder(title, uid=uid_for(title))
    log.info("created Grafana folder %r (uid %s)", title, created["uid"])
    return str(created["uid"])


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
    api = GrafanaApi.from_url(url, credential=token, timeout=timeout)
    results: list[PushResult] = []
    try:
        folder_uid = _folder_uid(api, folder) if folder else ""
        for uid, dashboard in sorted(dashboards.items()):
            try:
                existing = api.dashboard.get_dashboard(uid)
            except GrafanaClientError as exc:
                if exc.status_code != 404:
                    raise
                existing = None
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
            api.dashboard.update_dashboard(body)
            outcome: Outcome = "created" if existing is None else "updated"
            results.append(PushResult(uid, str(dashboard["title"]), outcome))
    except GrafanaException as exc:
        raise PushError(f"Grafana at {url} refused the request: {exc}") from exc
    except OSError as exc:
        raise PushError(f"cannot reach Grafana at {url}: {exc}") from exc
    finally:
        api.client.s.close()  # grafana-client leaves its HTTP session open
    return results
