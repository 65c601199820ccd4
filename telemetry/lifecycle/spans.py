"""A session's OpenTelemetry spans, once traced (:meth:`stormwatch.telemetry.Session.trace`).

:class:`SessionSpans` holds the rank's :class:`~stormwatch.telemetry.tracing.RankTracing`
(imported when tracing starts: the OpenTelemetry SDK is not loaded otherwise), opens spans
that never raise into training, and closes it at the session's end, counting the spans not
exported as ``tracing`` errors. No torch import here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stormwatch.telemetry.lifecycle.guard import warn_once


class SessionSpans:
    """The spans of one session (no-ops until :meth:`start`).

    Args:
        on_error: ``on_error(sink, exc)``: counts a failure (the rank telemetry's).
    """

    def __init__(self, on_error: Callable[[str, BaseException], None]) -> None:
        self._on_error = on_error
        self._tracing: Any = None  # stormwatch.telemetry.tracing.RankTracing

    @property
    def started(self) -> bool:
        return self._tracing is not None

    def start(
        self,
        *,
        otlp_endpoint: str | None,
        spans_dir: Path | None,
        flush_timeout: float,
        rank: int,
        attributes: dict[str, Any],
    ) -> None:
        """Begin exporting (see :meth:`stormwatch.telemetry.Session.trace`); once."""
        if self._tracing is not None:
            return
        from stormwatch.telemetry.tracing import RankTracing, SpanOptions

        options = SpanOptions(
            otlp_endpoint=otlp_endpoint, spans_dir=spans_dir, flush_timeout=flush_timeout
        )
        self._tracing = RankTracing(options, rank=rank, attributes=attributes)

    def span(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
        """A span around a ``with`` block; a null context when not traced or on failure."""
        tracing = self._tracing
        if tracing is None:
            return contextlib.nullcontext()
        try:
            return tracing.span(name, **attributes)
        except Exception as exc:
            warn_once("span:failed", "span(%r) failed: %s; not traced", name, exc)
            return contextlib.nullcontext()

    def close(self) -> None:
        """Flush and stop; spans not exported in time are counted as ``tracing`` errors."""
        tracing, self._tracing = self._tracing, None
        if tracing is not None:
            dropped = tracing.close()
            if dropped:
                self._on_error("tracing", RuntimeError(f"{dropped} spans not exported at exit"))


__all__ = ["SessionSpans"]
