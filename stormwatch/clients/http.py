"""HTTP plumbing every stormwatch client shares (aiohttp): connection options, one request
helper with one error mapping, and a base class that owns or borrows a session.

* :class:`HttpOptions`: TLS (CA file, client certificate and key, or skip verification),
  basic auth, a Bearer token (inline or read from a file on every request) and extra
  headers; validated on construction (:class:`~stormwatch.errors.ConfigError` naming the
  field).
* :func:`send` / :func:`request_json`: one request; transport failures, unexpected statuses
  and non-JSON bodies become the caller's error class, with one message format
  (``<what>: <METHOD> <url> ...``).
* :class:`HttpClient`: a base URL, a timeout and options; requests go through the caller's
  session when given, through one session while used as ``async with``, or through a
  short-lived session per call otherwise (safe from any event loop).
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import aiohttp

from stormwatch.clients.errors import ClientError
from stormwatch.errors import ConfigError
from stormwatch.urls import is_http_url

#: Builds the exception for a failed request from (message, HTTP status or None).
ErrorFactory = Callable[[str, int | None], Exception]

#: Bytes of an error answer quoted in the exception message.
SNIPPET_BYTES = 200


@dataclass(frozen=True, kw_only=True)
class HttpOptions:
    """How to reach a service over HTTP(S), beyond its URL.

    Attributes:
        ca_file: PEM bundle of the CA(s) that signed the server's certificate (default: the
            system's trust store).
        cert_file / key_file: client certificate (PEM) and its key for mutual TLS
            (``key_file`` may be omitted when the certificate file holds the key).
        insecure_skip_verify: do not verify the server's certificate (test set-ups only).
        username / password: HTTP basic auth.
        bearer_token: ``Authorization: Bearer <token>``.
        bearer_token_file: file holding the token, read on every request (so a rotated
            token is picked up); exclusive with ``bearer_token``.
        headers: further headers sent with every request.

    Raises:
        ConfigError: a file (CA, certificate, key, token file) does not exist, a key
            without a certificate, a password without a user name, basic auth together
            with a Bearer token, or ``Authorization`` in ``headers`` together with either
            (the message names the field).
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure_skip_verify: bool = False
    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    bearer_token_file: Path | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("ca_file", "cert_file", "key_file", "bearer_token_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"{name}: {path} is not a file")
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError("key_file: needs cert_file (the client certificate)")
        if self.password is not None and self.username is None:
            raise ConfigError("password: needs username (HTTP basic auth)")
        if self.bearer_token is not None and self.bearer_token_file is not None:
            raise ConfigError("bearer_token: give bearer_token or bearer_token_file, not both")
        bearer = self.bearer_token is not None or self.bearer_token_file is not None
        if bearer and self.username is not None:
            raise ConfigError("username: basic auth and a Bearer token exclude each other")
        if (bearer or self.username is not None) and any(
            k.lower() == "authorization" for k in self.headers
        ):
            raise ConfigError("headers: Authorization is set by username or bearer_token already")

    @cached_property
    def ssl_context(self) -> ssl.SSLContext | bool:
        """What aiohttp's ``ssl=`` takes: False to skip verification, True for the defaults,
        or a context with the CA file and client certificate."""
        if self.insecure_skip_verify and self.cert_file is None:
            return False
        if self.ca_file is None and self.cert_file is None:
            return not self.insecure_skip_verify
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file is not None else None
        )
        if self.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file is not None:
            keyfile = str(self.key_file) if self.key_file is not None else None
            context.load_cert_chain(str(self.cert_file), keyfile)
        return context

    def request_headers(self, error: ErrorFactory) -> dict[str, str]:
        """The headers of one request: ``headers``, and ``Authorization`` for basic auth
        (RFC 7617) or the Bearer token (the token file read now).

        Raises:
            the ``error`` class: the token file cannot be read.
        """
        headers = dict(self.headers)
        token = self.bearer_token
        if self.bearer_token_file is not None:
            try:
                token = self.bearer_token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise error(
                    f"cannot read the token file {self.bearer_token_file}: {exc.strerror or exc}",
                    None,
                ) from exc
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if self.username is not None:
            pair = f"{self.username}:{self.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        return headers


def check_http_url(url: str, name: str, example: str) -> str:
    """``url`` without a trailing ``/``.

    Raises:
        ConfigError: not an http(s) URL with a host and a valid port (the message names
            ``name``).
    """
    if not is_http_url(url):
        raise ConfigError(f"{name}: {url!r} is not an http(s) URL, e.g. {example}")
    return url.rstrip("/")


async def send(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    what: str,
    error: ErrorFactory,
    timeout: float,
    ok: Collection[int] | None = (200,),
    options: HttpOptions | None = None,
    headers: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> tuple[int, bytes]:
    """Send one request; returns ``(status, body)``.

    Args:
        what: the service, first word of every error message (``prometheus``, ``agent``).
        error: builds the exception from (message, status).
        timeout: seconds for the whole request.
        ok: statuses that are answers (None: every status is).
        options: TLS, auth and headers.
        headers: further headers for this request.
        kwargs: passed to :meth:`aiohttp.ClientSession.request` (``params``, ``json``).

    Raises:
        the ``error`` class: unreachable, timed out, or a status outside ``ok``.
    """
    opts = options or HttpOptions()
    merged = {**opts.request_headers(error), **(headers or {})}
    try:
        async with session.request(
            method,
            url,
            timeout=aiohttp.ClientTimeout(total=timeout),
            ssl=opts.ssl_context,
            headers=merged,
            **kwargs,
        ) as response:
            body = await response.read()
            status = response.status
    except (TimeoutError, aiohttp.ClientError) as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise error(f"{what}: {method} {url} failed: {detail}", None) from exc
    if ok is not None and status not in ok:
        snippet = body[:SNIPPET_BYTES].decode("utf-8", "replace").strip()
        raise error(f"{what}: {method} {url} answered HTTP {status}: {snippet}", status)
    return status, body


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    what: str,
    error: ErrorFactory,
    timeout: float,
    ok: Collection[int] | None = (200,),
    options: HttpOptions | None = None,
    **kwargs: Any,
) -> tuple[int, Any]:
    """:func:`send`, then parse the body as JSON; returns ``(status, value or None)``
    (None for an empty body).

    Raises:
        the ``error`` class: as :func:`send`, or a body that is not JSON.
    """
    status, body = await send(
        session,
        method,
        url,
        what=what,
        error=error,
        timeout=timeout,
        ok=ok,
        options=options,
        **kwargs,
    )
    if not body.strip():
        return status, None
    try:
        return status, json.loads(body)
    except ValueError as exc:
        raise error(f"{what}: {method} {url} did not return JSON (HTTP {status})", status) from exc


class HttpClient:
    """Base of the clients of one service at one base URL.

    Args:
        base_url: the service's root, e.g. ``http://127.0.0.1:19090``.
        timeout: seconds per request.
        options: TLS, auth and headers.
        session: an aiohttp session to use (the caller closes it). Without one, the client
            holds a session while used as ``async with`` and opens one per call otherwise.

    Raises:
        ConfigError: ``base_url`` is not an http(s) URL, or ``timeout`` is not > 0.
    """

    #: First word of error messages; names the URL field in ConfigError messages.
    what: ClassVar[str] = "service"
    url_field: ClassVar[str] = "url"
    url_example: ClassVar[str] = "http://127.0.0.1:8080"
    error: ClassVar[type[ClientError]] = ClientError

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float,
        options: HttpOptions | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = check_http_url(base_url, self.url_field, self.url_example)
        if not timeout > 0:
            raise ConfigError(f"timeout: must be > 0 seconds (got {timeout!r})")
        self.timeout = timeout
        self.options = options or HttpOptions()
        self._session = session
        self._owned: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> HttpClient:
        if self._session is None:
            self._owned = self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session this client opened (idempotent; a borrowed one is left open)."""
        owned, self._owned = self._owned, None
        if owned is not None:
            self._session = None
            await owned.close()

    @asynccontextmanager
    async def _session_for_call(self) -> AsyncIterator[aiohttp.ClientSession]:
        if self._session is not None:
            yield self._session
            return
        async with aiohttp.ClientSession() as session:
            yield session

    async def _send(
        self, method: str, path: str, *, ok: Collection[int] | None = (200,), **kwargs: Any
    ) -> tuple[int, bytes]:
        async with self._session_for_call() as session:
            return await send(
                session,
                method,
                f"{self.base_url}{path}",
                what=self.what,
                error=self.error,
                timeout=self.timeout,
                ok=ok,
                options=self.options,
                **kwargs,
            )


__all__ = [
    "ErrorFactory",
    "HttpClient",
    "HttpOptions",
    "check_http_url",
    "request_json",
    "send",
]
