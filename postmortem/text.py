"""The words and numbers every post-mortem prints: clock times, durations, alert names.

Times are Unix seconds shown as the reader's local wall clock with milliseconds (the
rank logs, Prometheus and the responder stamp times on one host, so a reader lines them
up by clock); durations are seconds with one decimal.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from stormwatch.contracts.labels import TRAINING_JOB_LABEL

#: Labels that name where an alert points, in the order they are printed.
ALERT_LABEL_KEYS = (TRAINING_JOB_LABEL, "rank", "node", "phase", "severity")
#: What is shown for a value that was not observed.
MISSING = "—"


def format_clock(at: float | None) -> str:
    """Local wall-clock time ``HH:MM:SS.mmm`` of Unix time ``at`` ("—" for None)."""
    if at is None:
        return MISSING
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int((at % 1) * 1000):03d}"


def format_seconds(value: float | None, missing: str = MISSING) -> str:
    """A duration in seconds, ``12.3 s`` (``missing`` for None)."""
    return missing if value is None else f"{value:.1f} s"


def format_optional(value: object) -> str:
    """``str(value)``, or "—" for None."""
    return MISSING if value is None else str(value)


def format_since(at: float | None, origin: float | None) -> str:
    """Signed seconds from ``origin`` to ``at`` (``+2.0 s``); "" when either is unknown."""
    if at is None or origin is None:
        return ""
    return f"{at - origin:+.1f} s"


def alert_label(
    alertname: str, labels: Mapping[str, str], keys: Sequence[str] = ALERT_LABEL_KEYS
) -> str:
    """``Name{training_job=..., rank=...}``: the alert with those of ``keys`` it carries, in that order
    (just ``Name`` when it carries none)."""
    inner = ", ".join(f"{k}={labels[k]}" for k in keys if k in labels)
    return f"{alertname}{{{inner}}}" if inner else alertname


__all__ = [
    "ALERT_LABEL_KEYS",
    "MISSING",
    "alert_label",
    "format_clock",
    "format_optional",
    "format_seconds",
    "format_since",
]
