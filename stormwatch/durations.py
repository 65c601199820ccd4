"""Prometheus-style durations (``1s``, ``500ms``, ``1m30s``) <-> seconds.

Alertmanager, Prometheus and Grafana write durations as strings; our configs hold
seconds (float) and convert only at the file boundary.
"""

from __future__ import annotations

import re

from stormwatch.errors import ConfigError

# Units in the order Prometheus requires them (model.ParseDuration).
_UNITS: tuple[tuple[str, float], ...] = (
    ("y", 365 * 86400.0),
    ("w", 7 * 86400.0),
    ("d", 86400.0),
    ("h", 3600.0),
    ("m", 60.0),
    ("s", 1.0),
    ("ms", 0.001),
)
_PATTERN = re.compile("".join(rf"(?:(?P<{u}>\d+){u})?" for u, _ in _UNITS) + "$")


def parse_duration(text: str, field: str) -> float:
    """Parse a Prometheus duration such as ``"1m30s"`` into seconds.

    Args:
        text: the duration; units ``y w d h m s ms``, largest first, integers only.
        field: name used in the error message (e.g. ``"--group-wait"``).

    Raises:
        ConfigError: the text is empty or not a Prometheus duration.
    """
    match = _PATTERN.match(text.strip()) if text.strip() else None
    if match is None:
        raise ConfigError(f"{field}: {text!r} is not a duration; use e.g. 500ms, 1s, 5m, 1h30m")
    return sum(float(match.group(u) or 0) * scale for u, scale in _UNITS)


def format_duration(seconds: float) -> str:
    """Format seconds as the shortest Prometheus duration (millisecond resolution).

    ``format_duration(90) == "1m30s"``, ``format_duration(0.5) == "500ms"``.

    Raises:
        ConfigError: ``seconds`` is negative or below one millisecond.
    """
    millis = round(seconds * 1000)
    if millis < 1:
        raise ConfigError(f"duration must be at least 1ms (got {seconds!r} s)")
    parts: list[str] = []
    for unit, scale in _UNITS:
        unit_ms = round(scale * 1000)
        count, millis = divmod(millis, unit_ms)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


__all__ = ["format_duration", "parse_duration"]
