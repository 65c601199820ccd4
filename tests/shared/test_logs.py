"""``stormwatch --log-format json`` (or ``STORMWATCH_LOG_FORMAT=json``): one JSON object per
log line on stderr, with the span's ids when a line is logged inside a span; text otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

#: Configures logging through the real CLI callback, then logs what a component would.
PROBE = """
import logging, sys
from opentelemetry.sdk.trace import TracerProvider
from stormwatch.cli import root
root.main([*sys.argv[1:], "-v", "alerts", "rules-path"], standalone_mode=False)
log = logging.getLogger("stormwatch.probe")
log.warning("two\\nlines", extra={"node": "gpu-1", "odd": object()})
log.debug("below the level")
with TracerProvider().get_tracer("t").start_as_current_span("s") as span:
    log.info("inside a span")
    print(format(span.get_span_context().trace_id, "032x"))
try:
    1 / 0
except ZeroDivisionError:
    log.exception("failed")
"""


def _probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "STORMWATCH_LOG_FORMAT"}
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **(env or {})},
        check=True,
    )


@pytest.mark.parametrize(
    ("args", "env"), [(("--log-format", "json"), {}), ((), {"STORMWATCH_LOG_FORMAT": "json"})]
)
def test_json_logs_are_one_object_per_line(args: tuple[str, ...], env: dict[str, str]) -> None:
    done = _probe(*args, env=env)
    trace_id = done.stdout.splitlines()[-1]
    lines = done.stderr.splitlines()
    records: list[dict[str, Any]] = [json.loads(line) for line in lines]
    assert [r["message"] for r in records] == ["two\nlines", "inside a span", "failed"]
    first, in_span, failed = records
    assert first["level"] == "WARNING" and first["logger"] == "stormwatch.probe"
    assert first["time"].endswith("Z") and first["node"] == "gpu-1"
    assert first["odd"].startswith("<object object")
    assert "trace_id" not in first
    assert in_span["trace_id"] == trace_id and len(in_span["span_id"]) == 16
    assert "ZeroDivisionError" in failed["exception"]


def test_text_stays_the_default() -> None:
    done = _probe()
    first = done.stderr.splitlines()[0]
    assert " WARNING stormwatch.probe: two" in first
    with pytest.raises(ValueError):
        json.loads(first)
