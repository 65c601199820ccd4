"""Bearer tokens: read from a file, compared in constant time."""

from __future__ import annotations

import hmac
from pathlib import Path

from stormwatch.errors import ConfigError

#: Tokens longer than this are refused when read (a token file is one short line).
MAX_TOKEN_BYTES = 4096


def read_token(path: Path, field: str = "token_file") -> str:
    """The Bearer token stored in ``path`` (surrounding whitespace removed).

    Raises:
        ConfigError: the file is missing, unreadable, empty, too long or not one line.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_TOKEN_BYTES:
        raise ConfigError(f"{field}: {path} is larger than {MAX_TOKEN_BYTES} bytes; is it a token?")
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{field}: {path} must hold an ASCII token") from exc
    if not token or any(c.isspace() for c in token):
        raise ConfigError(f"{field}: {path} must hold one non-empty token without spaces")
    return token


def bearer_matches(header: str | None, token: str) -> bool:
    """True when ``header`` is ``Bearer <token>`` (scheme case-insensitive, constant-time compare)."""
    scheme, _, value = (header or "").partition(" ")
    # Compare even on a wrong scheme, so timing does not tell the two apart.
    same = hmac.compare_digest(value.strip().encode(), token.encode())
    return scheme.lower() == "bearer" and same


__all__ = ["MAX_TOKEN_BYTES", "bearer_matches", "read_token"]
