"""How the ``stormwatch`` command writes its log: text for people, or JSON for log pipelines.

Only the CLI entry point calls :func:`configure` (libraries never configure the root logger).
``--log-format json`` (or ``STORMWATCH_LOG_FORMAT=json``) writes one JSON object per line on
stderr, the shape Loki, Fluent Bit, Vector and Elasticsearch read without a parser::

    {"time": "2026-01-05T10:00:00.123Z", "level": "WARNING", "logger": "stormwatch.agent...",
     "message": "...", "trace_id": "...", "span_id": "...", "exception": "Traceback ..."}

``trace_id``/``span_id`` (32 and 16 hex digits, as OpenTelemetry writes them) are there when
the line is logged inside a recording span, so a log line leads to its trace; fields given
with ``extra=`` are added as they are (``repr`` for what JSON cannot hold). The error a
command ends with, ``error: ...`` in text, is such a line too (``"level": "ERROR"``, with
its ``exit_code``: :func:`stormwatch.cli.main`).
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any, Literal

from opentelemetry import trace

LogFormat = Literal["text", "json"]
#: Environment variable read when ``--log-format`` is not given.
FORMAT_ENV = "STORMWATCH_LOG_FORMAT"
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        out: dict[str, Any] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            out["trace_id"] = format(context.trace_id, "032x")
            out["span_id"] = format(context.span_id, "016x")
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=repr, ensure_ascii=False)


def configure(level: int, fmt: LogFormat) -> None:
    """Send the root logger's records at ``level`` and above to stderr in ``fmt``."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


__all__ = ["FORMATS", "FORMAT_ENV", "JsonFormatter", "LogFormat", "configure"]
