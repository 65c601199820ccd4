"""Spans for a hot loop: timed on the caller's thread, built without the SDK's span machinery.

:meth:`Tracer.start_as_current_span <opentelemetry.trace.Tracer.start_as_current_span>`
costs about 21 µs per span in opentelemetry-sdk 1.45 (2-core development machine: the
SDK's ``_Span`` with its lock, bounded attributes and events list, ``use_span``, and the
processors' ``on_end``). A training step opens four or more, on the training thread
(issue 20: nothing per step that can be done elsewhere). :class:`TimedSpan` does what
the span needs on that thread and nothing else, about 9 µs:

* on enter: the sampler's decision (the provider's own ``sampler``, so
  ``OTEL_TRACES_SAMPLER`` applies as it does to SDK spans), the ids (the provider's
  ``id_generator``), and the span made current as a ``NonRecordingSpan`` carrying that
  context, so spans started inside, by any tracer, are its children and log lines are
  correlated with it;
* on exit: the context restored, and one :class:`~opentelemetry.sdk.trace.ReadableSpan`
  (name, ids, parent, start and end in ns, attributes, status, the ``exception`` event as
  ``use_span`` records it, within the ``OTEL_SPAN_*``/``OTEL_EVENT_*``/``OTEL_ATTRIBUTE_*``
  limits) handed to the provider's span processors' ``on_end``, those added to the provider
  by anyone included. The batch processor queues it; its worker thread encodes and
  exports it.

What differs from an SDK span: ``trace.get_current_span()`` inside the block is the
non-recording span, so ``set_attribute`` or ``add_event`` on it are ignored (spans a
user starts inside are recorded as usual). Attributes are checked as the SDK checks them
(:class:`~opentelemetry.attributes.BoundedAttributes`, with the ``OTEL_SPAN_ATTRIBUTE_*``
limits), when the span ends. A :class:`TimedSpan` is entered once (a second ``with``
raises ``RuntimeError``, as the SDK's context manager refuses a second use).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from contextvars import Token
from types import TracebackType
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import DEFAULT_ON
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv.attributes import exception_attributes
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


class TimedSpans:
    """Where :class:`TimedSpan` s go: one provider's sampler, ids, resource and processors.

    Args:
        provider: the tracer provider (its ``sampler``, ``id_generator`` and ``resource``).
        scope: the instrumentation scope the spans carry (tracer name and version).
        processors: the processors each ended span is given to, in order, when the provider
            has no span-processor chain of its own to hand it to (the SDK's
            ``_active_span_processor``, which also reaches processors added to the provider
            directly); the caller owns the sequence and may append to it later.
    """

    def __init__(
        self,
        provider: TracerProvider,
        scope: InstrumentationScope,
        processors: Sequence[SpanProcessor],
    ) -> None:
        self.sampler = provider.sampler
        #: The SDK's default sampler, ParentBased(ALWAYS_ON): its decision is taken here
        #: without the call (the parent's sampled flag and trace state; a root is sampled).
        self.parent_based_on = self.sampler is DEFAULT_ON
        self.ids = provider.id_generator
        self.resource = provider.resource
        self.scope = scope
        self.processors = processors
        # Private in the SDK (1.45), but the one place every processor of the provider is
        # reached in order; ``tests/shared/test_otel_timed.py`` notices if it goes.
        self._chain: SpanProcessor | None = getattr(provider, "_active_span_processor", None)
        self.limits = limits = SpanLimits()
        self._max_attributes = limits.max_span_attributes
        self._max_length = limits.max_span_attribute_length

    def span(self, name: str, attributes: dict[str, Any]) -> TimedSpan:
        """A span named ``name`` around a ``with`` block (see the module docstring)."""
        return TimedSpan(self, name, attributes)

    def attributes(self, values: dict[str, Any]) -> BoundedAttributes | None:
        """``values`` checked and bounded as the SDK does (invalid values are dropped, logged)."""
        if not values:
            return None
        return BoundedAttributes(
            self._max_attributes, values, immutable=True, max_value_len=self._max_length
        )

    def end(self, span: ReadableSpan) -> None:
        """Hand an ended span to every processor (``on_end``)."""
        if self._chain is not None:
            self._chain.on_end(span)
            return
        for processor in tuple(self.processors):
            processor.on_end(span)


class TimedSpan:
    """One span of :class:`TimedSpans` (a context manager; use once)."""

    __slots__ = ("_attributes", "_context", "_name", "_owner", "_parent", "_start", "_token")

    def __init__(self, owner: TimedSpans, name: str, attributes: dict[str, Any]) -> None:
        self._owner = owner
        self._name = name
        self._attributes = attributes
        self._context: SpanContext | None = None  # None: not recorded (sampled out)
        self._token: Token[Context] | None = None

    def __enter__(self) -> TimedSpan:
        if self._token is not None:
            raise RuntimeError(f"span {self._name!r} was entered already: open a new one")
        owner = self._owner
        parent_context = context_api.get_current()
        parent = trace.get_current_span(parent_context).get_span_context()
        valid = parent.is_valid
        trace_id = parent.trace_id if valid else owner.ids.generate_trace_id()
        if owner.parent_based_on:
            sampled = parent.trace_flags.sampled if valid else True
            recording, trace_state = sampled, parent.trace_state if valid else None
        else:
            decision = owner.sampler.should_sample(
                parent_context, trace_id, self._name, SpanKind.INTERNAL, self._attributes
            )
            sampled = decision.decision.is_sampled()
            recording, trace_state = decision.decision.is_recording(), decision.trace_state
        span_context = SpanContext(
            trace_id,
            owner.ids.generate_span_id(),
            is_remote=False,
            trace_flags=_SAMPLED if sampled else _NOT_SAMPLED,
            trace_state=trace_state,
        )
        if recording:
            self._context = span_context
            self._parent = parent if valid else None
        self._token = context_api.attach(
            trace.set_span_in_context(NonRecordingSpan(span_context), parent_context)
        )
        self._start = time.time_ns()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end = time.time_ns()
        if self._token is not None:
            context_api.detach(self._token)
        span_context = self._context
        if span_context is None:
            return
        owner = self._owner
        status = Status(StatusCode.UNSET)
        events: Sequence[Event] = ()
        if isinstance(exc, Exception):  # as use_span: not GeneratorExit, KeyboardInterrupt
            status = Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
            events = _exception_events(exc, end, owner.limits)
        owner.end(
            ReadableSpan(
                name=self._name,
                context=span_context,
                parent=self._parent,
                resource=owner.resource,
                attributes=owner.attributes(self._attributes),
                events=events,
                kind=SpanKind.INTERNAL,
                status=status,
                start_time=self._start,
                end_time=end,
                instrumentation_scope=owner.scope,
            )
        )


def _exception_events(exc: BaseException, when: int, limits: SpanLimits) -> BoundedList:
    """The span's events: the ``exception`` event, with the attributes
    ``Span.record_exception`` gives it, bounded as ``Span.add_event`` bounds them."""
    kind = type(exc)
    module = kind.__module__
    name = f"{module}.{kind.__qualname__}" if module and module != "builtins" else kind.__qualname__
    attributes = {
        exception_attributes.EXCEPTION_TYPE: name,
        exception_attributes.EXCEPTION_MESSAGE: str(exc),
        exception_attributes.EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exc)),
        exception_attributes.EXCEPTION_ESCAPED: "False",
    }
    events: BoundedList = BoundedList(limits.max_events)
    bounded = BoundedAttributes(
        limits.max_event_attributes,
        attributes,
        immutable=True,
        max_value_len=limits.max_attribute_length,
    )
    events.append(Event("exception", bounded, timestamp=when))
    return events


__all__ = ["TimedSpan", "TimedSpans"]
