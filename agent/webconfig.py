"""TLS and basic auth for the agent's listeners, from a Prometheus web-config file.

The file format is the Prometheus exporter-toolkit's ``--web.config.file``
(https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md),
so the file an operator already writes for node_exporter works here::

    tls_server_config:
      cert_file: /etc/stormwatch/agent.crt      # relative paths: to this file's folder
      key_file: /etc/stormwatch/agent.key
      client_auth_type: NoClientCert            # or VerifyClientCertIfGiven, RequireAndVerifyClientCert
      client_ca_file: /etc/stormwatch/ca.crt    # needed to verify client certificates
      min_version: TLS12                        # TLS10..TLS13 (default TLS12, as upstream)
      max_version: TLS13
    http_server_config:
      headers: {X-Frame-Options: deny}          # added to every answer
    basic_auth_users:
      prometheus: $2y$10$...                    # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')

Differences from upstream, each refused with a message rather than ignored:
``RequestClientCert`` / ``RequireAnyClientCert`` (Python's ``ssl`` cannot ask for a
certificate without verifying it), ``cipher_suites`` / ``curve_preferences`` (Go
names). ``prefer_server_cipher_suites`` and ``http2`` are accepted and have no
effect (aiohttp serves HTTP/1.1).

Passwords are checked with ``bcrypt.checkpw`` (tens of milliseconds at cost 10);
like exporter-toolkit, a successful check is cached (keyed by user and a SHA-256 of
the password), so that a scrape every second does not pay for bcrypt each time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ssl
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stormwatch.agent.errors import WebConfigError

ClientAuthType = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
TlsVersion = Literal["TLS10", "TLS11", "TLS12", "TLS13"]

_TLS_VERSIONS: dict[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
#: Successful password checks remembered (exporter-toolkit caches them too).
AUTH_CACHE_SIZE = 100


class TlsServerConfig(BaseModel):
    """``tls_server_config``; see the module docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cert_file: Path
    key_file: Path
    client_auth_type: ClientAuthType | None = None
    client_ca_file: Path | None = None
    min_version: TlsVersion = "TLS12"
    max_version: TlsVersion = "TLS13"
    prefer_server_cipher_suites: bool = True

    @field_validator("client_auth_type")
    @classmethod
    def _supported_auth(cls, value: str | None) -> str | None:
        if value in ("RequestClientCert", "RequireAnyClientCert"):
            raise ValueError(
                f"{value} (a client certificate without verification) is not supported; "
                "use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file"
            )
        return value


class HttpServerConfig(BaseModel):
    """``http_server_config``: extra response headers (``http2`` is accepted, unused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    http2: bool = True
    headers: dict[str, str] = Field(default_factory=dict)


class WebConfig(BaseModel):
    """A whole web-config file. An empty file means plain HTTP without auth."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig = Field(default_factory=HttpServerConfig)
    basic_auth_users: dict[str, str] = Field(default_factory=dict)

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, value: dict[str, str]) -> dict[str, str]:
        for user, hashed in value.items():
            if ":" in user or not user:
                raise ValueError(f"user {user!r}: a user name must be non-empty, without ':'")
            if not str(hashed).startswith(_BCRYPT_PREFIXES) or len(str(hashed)) != 60:
                raise ValueError(
                    f"user {user!r}: expected a bcrypt hash ($2y$10$... 60 characters), not a "
                    "password; make one with `htpasswd -nBC 10 \"\" | tr -d ':'` or "
                    "python -c 'import bcrypt; print(bcrypt.hashpw(b\"PASSWORD\", bcrypt.gensalt()).decode())'"
                )
        return value


def load_web_config(path: Path) -> WebConfig:
    """Read and validate ``path``; relative file paths become relative to its folder.

    Raises:
        WebConfigError: unreadable file, invalid YAML, an unknown or invalid key
            (named, with the fix), or a certificate/key/CA file that cannot be loaded.
    """
    from stormwatch.yamltext import yaml_mapping  # only an agent given a web config reads YAML

    where = f"web config {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WebConfigError(f"{where}: cannot read it: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise WebConfigError(f"{where}: not UTF-8 text") from exc
    raw = yaml_mapping(
        text,
        where,
        error=WebConfigError,
        invalid="invalid YAML",
        not_mapping="expected a mapping of keys (tls_server_config, ...)",
    )
    tls = raw.get("tls_server_config")
    if isinstance(tls, dict):
        for key in ("cipher_suites", "curve_preferences"):
            if key in tls:
                raise WebConfigError(
                    f"{where}: tls_server_config.{key} is not supported by the stormwatch "
                    "agent (OpenSSL picks secure defaults); remove the key"
                )
    try:
        config = WebConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(_problem(err) for err in exc.errors())
        raise WebConfigError(f"{where}: {problems}") from exc
    if config.tls_server_config is not None:
        config = config.model_copy(
            update={"tls_server_config": _resolve(config.tls_server_config, path.parent)}
        )
        server_ssl_context(config, where)  # fail now, naming file and key, not at first use
    return config


def _problem(err: Mapping[str, object]) -> str:
    loc = ".".join(str(part) for part in err["loc"]) or "file"  # type: ignore[attr-defined]
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown key; check its spelling against the web-config format"
    if err["type"] == "missing":
        return f"{loc}: required; add it"
    return f"{loc}: {str(err['msg']).removeprefix('Value error, ')}"


def _resolve(tls: TlsServerConfig, base: Path) -> TlsServerConfig:
    def rel(value: Path | None) -> Path | None:
        return None if value is None or value.is_absolute() else base / value

    update = {
        key: resolved
        for key in ("cert_file", "key_file", "client_ca_file")
        if (resolved := rel(getattr(tls, key))) is not None
    }
    return tls.model_copy(update=update)


def server_ssl_context(config: WebConfig, where: str = "web config") -> ssl.SSLContext | None:
    """The server-side ``SSLContext`` for ``config`` (None without ``tls_server_config``);
    ``where`` starts the error messages (``web config /etc/stormwatch/web.yml``).

    Raises:
        WebConfigError: a certificate, key or CA file cannot be loaded, or the
            client-auth settings contradict each other.
    """
    tls = config.tls_server_config
    if tls is None:
        return None
    prefix = f"{where}: tls_server_config"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _TLS_VERSIONS[tls.min_version]
    context.maximum_version = _TLS_VERSIONS[tls.max_version]
    if context.minimum_version > context.maximum_version:
        raise WebConfigError(f"{prefix}.min_version {tls.min_version} is above max_version")
    for key in ("cert_file", "key_file"):
        if not getattr(tls, key).is_file():
            raise WebConfigError(f"{prefix}.{key}: no file {getattr(tls, key)}; fix the path")
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except ssl.SSLError as exc:
        raise WebConfigError(
            f"{prefix}: cert_file {tls.cert_file} and key_file {tls.key_file} are not a PEM "
            f"certificate and its private key ({exc.reason or exc})"
        ) from exc
    auth = tls.client_auth_type
    if auth is None:  # upstream: a CA file alone means "verify"
        auth = "RequireAndVerifyClientCert" if tls.client_ca_file else "NoClientCert"
    if auth == "NoClientCert":
        context.verify_mode = ssl.CERT_NONE
        return context
    if tls.client_ca_file is None:
        raise WebConfigError(f"{prefix}.client_ca_file: required by client_auth_type {auth}")
    try:
        context.load_verify_locations(cafile=str(tls.client_ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(
            f"{prefix}.client_ca_file: cannot load {tls.client_ca_file} as PEM certificates ({exc})"
        ) from exc
    context.verify_mode = (
        ssl.CERT_REQUIRED if auth == "RequireAndVerifyClientCert" else ssl.CERT_OPTIONAL
    )
    return context


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against ``basic_auth_users``.

    Thread-safe; :meth:`check` may take tens of milliseconds (bcrypt) on a cache miss.
    """

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = {user: hashed.encode() for user, hashed in users.items()}
        self._lock = threading.Lock()
        self._good: dict[tuple[str, bytes], bytes] = {}

    @property
    def enabled(self) -> bool:
        """Whether any user is configured (otherwise every request passes)."""
        return bool(self._users)

    @staticmethod
    def parse(header: str) -> tuple[str, bytes] | None:
        """``(user, password)`` from a ``Basic`` header, None when absent or malformed."""
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = decoded.partition(b":")
        if not sep:
            return None
        try:
            return user.decode("utf-8"), password
        except UnicodeDecodeError:
            return None

    def cached(self, user: str, password: bytes) -> bool:
        """Whether this exact pair was accepted before (no bcrypt)."""
        hashed = self._users.get(user)
        digest = hashlib.sha256(password).digest()
        with self._lock:
            known = self._good.get((user, digest))
        return hashed is not None and known is not None and hmac.compare_digest(known, hashed)

    def check(self, user: str, password: bytes) -> bool:
        """Whether ``user`` exists and ``password`` matches its bcrypt hash."""
        if self.cached(user, password):
            return True
        import bcrypt  # only an agent with basic-auth users loads it

        hashed = self._users.get(user)
        if hashed is None:
            # Spend the same time as for a known user: no user enumeration by timing.
            bcrypt.checkpw(password, _DUMMY_HASH)
            return False
        try:
            ok = bcrypt.checkpw(password, hashed)
        except ValueError:
            return False
        if ok:
            with self._lock:
                if len(self._good) >= AUTH_CACHE_SIZE:
                    self._good.clear()
                self._good[(user, hashlib.sha256(password).digest())] = hashed
        return ok


_DUMMY_HASH = b"$2b$10$abcdefghijklmnopqrstuu5oQlZHSMjZ3VyX3s7Gpo5mRMPm7I6hW"


__all__ = [
    "AUTH_CACHE_SIZE",
    "BasicAuth",
    "HttpServerConfig",
    "TlsServerConfig",
    "WebConfig",
    "load_web_config",
    "server_ssl_context",
]
