"""The timeline both post-mortems print: rows from every source, merged by time.

Each source adapter makes :class:`TimelineEvent` rows from what it read (journal
records, alerts, responder actions, agent events, rank logs, spans); this module
orders them. An experiment keeps the moments it expected but did not observe
(``at`` None) at the end (:func:`in_order`); an incident keeps only what happened
inside its window (:func:`within`), at most :data:`MAX_EVENTS_PER_SOURCE` rows of one
chatty source (:func:`capped`).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from stormwatch.postmortem.document import Table
from stormwatch.postmortem.text import format_clock, format_since

#: Timeline rows kept per source of many events (agent events, audit entries, spans, alerts).
MAX_EVENTS_PER_SOURCE = 25
#: Seconds after a window's end a row still belongs to it (clocks of one host, stamped
#: at different moments).
WINDOW_SLACK_SECONDS = 1.0


class TimelineEvent(BaseModel):
    """One line of the timeline; ``at`` None means "not observed".

    Attributes:
        at: Unix seconds.
        event: what happened, in words.
        source: where it was read (``journal``, ``prometheus``, ``rank logs``, ...).
        detail: anything else worth a cell (an alert's labels, a step, a reason).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: float | None
    event: str
    source: str
    detail: str = ""


def in_order(events: Iterable[TimelineEvent]) -> list[TimelineEvent]:
    """Observed rows by time (ties keep their order), then the unobserved ones as given."""
    rows = list(events)
    seen = [e for e in rows if e.at is not None]
    return sorted(seen, key=lambda e: e.at or 0.0) + [e for e in rows if e.at is None]


def within(
    events: Iterable[TimelineEvent],
    start: float,
    end: float,
    *,
    slack: float = WINDOW_SLACK_SECONDS,
) -> list[TimelineEvent]:
    """The rows observed in ``[start, end + slack]``, by time (ties keep their order)."""
    kept = [e for e in events if e.at is not None and start <= e.at <= end + slack]
    return sorted(kept, key=lambda e: e.at or 0.0)


def capped(
    events: list[TimelineEvent],
    what: str,
    notes: list[str],
    *,
    limit: int = MAX_EVENTS_PER_SOURCE,
) -> list[TimelineEvent]:
    """The first ``limit`` rows; how many ``what`` rows were left out, and from when to
    when, is appended to ``notes``."""
    if len(events) > limit:
        seen = [e.at for e in events[limit:] if e.at is not None]
        span = f", {format_clock(min(seen))} to {format_clock(max(seen))}" if seen else ""
        notes.append(f"timeline: {len(events) - limit} more {what} events left out{span}")
    return events[:limit]


def timeline_table(timeline: list[TimelineEvent], origin: float | None, since: str) -> Table:
    """The timeline as a table: time, seconds since ``origin`` (column ``since <since>``),
    event, source, detail; a moment not observed reads "not observed"."""
    return Table(
        ("time", f"since {since}", "event", "source", "detail"),
        [
            (
                format_clock(e.at) if e.at is not None else "not observed",
                format_since(e.at, origin),
                e.event,
                e.source,
                e.detail,
            )
            for e in timeline
        ],
    )


__all__ = [
    "MAX_EVENTS_PER_SOURCE",
    "WINDOW_SLACK_SECONDS",
    "TimelineEvent",
    "capped",
    "in_order",
    "timeline_table",
    "within",
]
