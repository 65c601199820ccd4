"""The few calls of Grafana's HTTP API stormwatch makes, on the shared aiohttp plumbing.

Grafana's documented endpoints (grafana.com/docs/grafana/latest/developers/http_api/
{folder,dashboard,annotations}/), Bearer token (a service-account token):

* ``GET /api/folders`` and ``POST /api/folders``: :meth:`GrafanaClient.folders`,
  :meth:`GrafanaClient.create_folder`;
* ``GET /api/dashboards/uid/<uid>`` and ``POST /api/dashboards/db``:
  :meth:`GrafanaClient.dashboard`, :meth:`GrafanaClient.save_dashboard`;
* ``POST /api/annotations``: :meth:`GrafanaClient.add_annotation`.

This replaced grafana-client, whose HTTP stack (niquests, urllib3-future) installs a ``.pth``
file that swaps ``urllib3`` for every package in the environment; five requests do not need
a second HTTP library (README.md, "Dependencies").
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from stormwatch.clients.errors import GrafanaAPIError
from stormwatch.clients.http import HttpClient, HttpOptions

#: Seconds per request (``dashboards push --timeout`` sets another).
DEFAULT_TIMEOUT = 10.0


class GrafanaClient(HttpClient):
    """Grafana's folder, dashboard and annotation endpoints.

    Args:
        base_url: Grafana's root, e.g. ``http://127.0.0.1:3000``.
        token: a service-account token, sent as ``Authorization: Bearer``.
        timeout: seconds per request.
        session: an aiohttp session to use (the caller closes it).

    Raises:
        ConfigError: ``base_url`` is not an http(s) URL, or ``timeout`` <= 0.
    """

    what = "grafana"
    url_field = "url"
    url_example = "http://127.0.0.1:3000"
    error = GrafanaAPIError

    def __init__(
        self,
        base_url: str,
        *,
        token: str,
        timeout: float = DEFAULT_TIMEOUT,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        super().__init__(
            base_url, timeout=timeout, options=HttpOptions(bearer_token=token), session=session
        )

    async def folders(self) -> list[dict[str, Any]]:
        """``GET /api/folders``: every folder (``uid``, ``title``...).

        Raises:
            GrafanaAPIError: unreachable, an error status, or not a JSON list.
        """
        folders = await self._json("GET", "/api/folders")
        if not isinstance(folders, list):
            raise GrafanaAPIError(f"grafana: GET {self.base_url}/api/folders: not a list")
        return folders

    async def create_folder(self, title: str, *, uid: str) -> dict[str, Any]:
        """``POST /api/folders``; returns the folder Grafana made (its ``uid``...)."""
        folder = await self._json("POST", "/api/folders", json={"title": title, "uid": uid})
        if not isinstance(folder, dict) or "uid" not in folder:
            raise GrafanaAPIError(f"grafana: POST {self.base_url}/api/folders: no uid")
        return folder

    async def dashboard(self, uid: str) -> dict[str, Any] | None:
        """``GET /api/dashboards/uid/<uid>``: ``{"dashboard": ..., "meta": ...}``, or None
        when there is no such dashboard (HTTP 404)."""
        status, body = await self._send("GET", f"/api/dashboards/uid/{uid}", ok=(200, 404))
        if status == 404:
            return None
        return self._parse("GET", f"/api/dashboards/uid/{uid}", status, body)

    async def save_dashboard(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/dashboards/db`` with ``body`` (``dashboard``, ``overwrite``,
        ``folderUid``, ``message``)."""
        saved = await self._json("POST", "/api/dashboards/db", json=body)
        return saved if isinstance(saved, dict) else {}

    async def add_annotation(self, body: dict[str, Any]) -> None:
        """``POST /api/annotations`` with ``body`` (``time``/``timeEnd`` Unix ms, ``tags``,
        ``text``, ``dashboardUID``)."""
        await self._send("POST", "/api/annotations", json=body)

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        status, body = await self._send(method, path, **kwargs)
        return self._parse(method, path, status, body)

    def _parse(self, method: str, path: str, status: int, body: bytes) -> Any:
        try:
            return json.loads(body)
        except ValueError as exc:
            raise GrafanaAPIError(
                f"grafana: {method} {self.base_url}{path} did not return JSON (HTTP {status})",
                status,
            ) from exc


__all__ = ["DEFAULT_TIMEOUT", "GrafanaClient"]
