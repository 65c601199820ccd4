"""Timed spans (stormwatch.otel.timed, issue 20): what the training thread's spans export is
what SDK spans export (names, ids, parents, attributes, status, the exception event), built
without the SDK's span object; the standard sampler variables still apply."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from stormwatch.logs import JsonFormatter
from stormwatch.otel import Tracing, TracingOptions
from stormwatch.telemetry.tracing import RankTracing, SpanOptions


@pytest.fixture(autouse=True)
def _no_sampler_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "OTEL_SDK_DISABLED",
        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
        "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
        "OTEL_SPAN_EVENT_COUNT_LIMIT",
    ):
        monkeypatch.delenv(name, raising=False)


def _spans(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    return {span["name"]: span for span in spans}


def _tracing(path: Path) -> Tracing:
    return Tracing(
        TracingOptions(
            service_name="stormwatch-test",
            tracer_name="stormwatch.test",
            resource={"rank": 2},
            spans_file=path,
        )
    )


def _timed(tracing: Tracing, name: str, **attributes: Any) -> Any:
    span = tracing.timed_span(name, attributes)
    assert span is not None
    return span


def test_a_timed_span_exports_what_an_sdk_span_exports(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    tracing = _tracing(path)
    with tracing.tracer.start_as_current_span("sdk", attributes={"step": 7, "phase": "fwd"}):
        pass
    with _timed(tracing, "timed", step=7, phase="fwd"):
        pass
    assert tracing.shutdown() == 0
    spans = _spans(path)
    sdk, timed = spans["sdk"], spans["timed"]
    ignored = {"name", "context", "start_time", "end_time"}
    assert {k: v for k, v in timed.items() if k not in ignored} == {
        k: v for k, v in sdk.items() if k not in ignored
    }
    assert timed["attributes"] == {"step": 7, "phase": "fwd"}
    assert timed["resource"]["attributes"]["rank"] == 2
    assert timed["start_time"] <= timed["end_time"]
    assert tracing.counts() == {"ended": 2, "exported": 2, "failed": 0}


def test_spans_started_inside_a_timed_span_are_its_children_whichever_tracer(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spans.jsonl"
    tracing = _tracing(path)
    with _timed(tracing, "step") as step:
        current = trace.get_current_span().get_span_context()
        # a user's SDK span inside
        with _timed(tracing, "forward"), tracing.tracer.start_as_current_span("user"):
            pass
    assert not trace.get_current_span().get_span_context().is_valid  # context restored
    tracing.shutdown()
    spans = _spans(path)
    step_id = spans["step"]["context"]["span_id"]
    assert step_id == f"0x{current.span_id:016x}" and step is not None
    assert spans["step"]["parent_id"] is None
    assert spans["forward"]["parent_id"] == step_id
    assert spans["user"]["parent_id"] == spans["forward"]["context"]["span_id"]
    trace_ids = {span["context"]["trace_id"] for span in spans.values()}
    assert len(trace_ids) == 1


def test_log_lines_inside_a_timed_span_carry_its_ids(tmp_path: Path) -> None:
    tracing = _tracing(tmp_path / "spans.jsonl")
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "hello", None, None)
    with _timed(tracing, "step"):
        context = trace.get_current_span().get_span_context()
        line = json.loads(JsonFormatter().format(record))
    tracing.shutdown()
    assert line["trace_id"] == f"{context.trace_id:032x}"
    assert line["span_id"] == f"{context.span_id:016x}"


def test_an_exception_is_recorded_as_use_span_records_it_and_raised(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    tracing = _tracing(path)
    with pytest.raises(ValueError, match="bad batch"), _timed(tracing, "step", step=3):
        raise ValueError("bad batch")
    # not an error: no status, as use_span
    with pytest.raises(KeyboardInterrupt), _timed(tracing, "interrupted"):
        raise KeyboardInterrupt
    tracing.shutdown()
    spans = _spans(path)
    step = spans["step"]
    assert step["status"] == {"status_code": "ERROR", "description": "ValueError: bad batch"}
    [event] = step["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "ValueError"
    assert event["attributes"]["exception.message"] == "bad batch"
    assert "raise ValueError" in event["attributes"]["exception.stacktrace"]
    assert spans["interrupted"]["status"] == {"status_code": "UNSET"}


def test_odd_attributes_are_cleaned_as_the_sdk_cleans_them_never_raised(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    tracing = _tracing(path)
    odd = {"step": 1, "batch": {"n": 2}, "nothing": None, "obj": object(), "mixed": [1, "a"]}
    with tracing.tracer.start_as_current_span("sdk", attributes=odd):
        pass
    with _timed(tracing, "timed", **odd):
        pass
    tracing.shutdown()
    spans = _spans(path)
    assert spans["timed"]["attributes"] == spans["sdk"]["attributes"]
    assert spans["timed"]["attributes"]["step"] == 1


@pytest.mark.parametrize(
    ("sampler", "argument", "exported"),
    [("always_off", None, 0), ("traceidratio", "0", 0), ("traceidratio", "1", 2)],
)
def test_the_sampler_variables_apply_to_timed_spans(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sampler: str,
    argument: str | None,
    exported: int,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if argument is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", argument)
    path = tmp_path / "spans.jsonl"
    tracing = _tracing(path)
    with _timed(tracing, "step"):
        sampled = trace.get_current_span().get_span_context().trace_flags.sampled
        with _timed(tracing, "forward"):
            pass
    tracing.shutdown()
    assert len(_spans(path)) == exported
    assert sampled == bool(exported)  # children see the decision (parent-based samplers)


def test_a_sampled_out_parent_is_followed_by_the_default_sampler(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    tracing = _tracing(path)
    parent = trace.NonRecordingSpan(
        trace.SpanContext(1, 2, is_remote=True, trace_flags=trace.TraceFlags(0))
    )
    with trace.use_span(parent), _timed(tracing, "step"):
        pass
    with _timed(tracing, "root"):
        pass
    tracing.shutdown()
    assert set(_spans(path)) == {"root"}


def test_rank_spans_are_timed_and_a_noop_without_a_destination(tmp_path: Path) -> None:
    traced = RankTracing(SpanOptions(spans_dir=tmp_path), rank=1)
    with traced.span("step", step=1):
        assert trace.get_current_span().get_span_context().is_valid
    traced.close()
    assert _spans(tmp_path / "rank1.jsonl")["step"]["attributes"] == {"step": 1}
    silent = RankTracing(SpanOptions(), rank=1)
    with silent.span("step", step=1):
        assert not trace.get_current_span().get_span_context().is_valid
    assert silent.close() == 0


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "16"),  # the event's strings cut to 16
        ("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "1"),  # one of the event's four attributes
        ("OTEL_SPAN_EVENT_COUNT_LIMIT", "0"),  # no event at all
    ],
)
def test_the_exception_event_is_bounded_by_the_span_limits_as_the_sdks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    path = tmp_path / "spans.jsonl"
    tracing = _tracing(path)
    for span in (tracing.tracer.start_as_current_span("sdk"), _timed(tracing, "timed")):
        with pytest.raises(ValueError), span:
            raise ValueError("a message well over sixteen characters long")
    tracing.shutdown()
    spans = _spans(path)

    def events(name: str) -> list[dict[str, Any]]:
        return [{**e, "timestamp": None} for e in spans[name]["events"]]

    assert events("timed") == events("sdk")
    assert os.environ[variable] == value


def test_a_processor_added_to_the_provider_sees_timed_spans(tmp_path: Path) -> None:
    tracing = _tracing(tmp_path / "spans.jsonl")
    seen: list[str] = []

    class Seen(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            seen.append(span.name)

    assert tracing.provider is not None
    tracing.provider.add_span_processor(Seen())
    with tracing.tracer.start_as_current_span("sdk"):
        pass
    with _timed(tracing, "timed"):
        pass
    tracing.shutdown()
    assert seen == ["sdk", "timed"]
    assert tracing.counts() == {"ended": 2, "exported": 2, "failed": 0}


def test_a_timed_span_is_entered_once(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    tracing = _tracing(path)
    span = _timed(tracing, "once")
    with pytest.raises(RuntimeError, match="entered already"), span, span:
        pass
    assert not trace.get_current_span().get_span_context().is_valid  # context restored
    with pytest.raises(RuntimeError, match="entered already"), span:
        pass
    tracing.shutdown()
    assert list(_spans(path)) == ["once"]
