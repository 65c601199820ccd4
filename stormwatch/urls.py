"""The one check that a setting is an http(s) URL (stdlib only: the trainer imports it too).

``urllib.parse.urlsplit`` raises ``ValueError`` for a broken IPv6 literal
(``http://[::1``) and ``SplitResult.port`` for a port out of range; every caller
wants "not a URL" instead, so that it can name its flag or variable and exit 2.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def is_http_url(url: str) -> bool:
    """Whether ``url`` is an http(s) URL with a host and, when it has one, a port in 0-65535,
    without spaces or control characters (``urlsplit`` keeps them in the host name)."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError when out of range or not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


__all__ = ["is_http_url"]
