"""Fixtures of the client tests: stand-in services on loopback (aiohttp); the test
certificate is ``tls_pair`` of ``tests/conftest.py``."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
from aiohttp import web

Serve = Callable[..., AbstractAsyncContextManager[str]]


@asynccontextmanager
async def _serve(
    app: web.Application, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"{'https' if ssl_context else 'http'}://{host}:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
def serve() -> Serve:
    """``async with serve(app[, ssl_context]) as url``: the app on a loopback port."""
    return _serve
