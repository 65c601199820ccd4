"""Counting a soak window's alerts from Prometheus range results, and the events near each.

Prometheus keeps one ``ALERTS`` series per alert (name and labels) and state (``pending``,
``firing``) while the rule holds; a range query of ``ALERTS{alertstate="firing"}`` at the
rule evaluation interval has a sample at every evaluation at which the alert was firing
(Prometheus ends the series with a staleness marker when it resolves, so a resolved alert
has no sample after it). So, per alert:

* it *fired* in the window when its firing series has a sample there: first and last firing
  sample, firing time (samples x the interval), and its separate stretches (a gap of more
  than 1.5 intervals splits two), each with the event nearest its start;
* it was *pending only* when its pending series has a sample in the window and its firing
  series none (informational: a rule's ``for`` held it back).

Each alert is placed against the soak's events (:class:`~.report.SoakEvent`): the one
closest to its first sample, and the latest at or before it (what most likely caused it).
The same stretches, read from the phase gauge, give the evaluation pauses
(:func:`phase_passes`). :func:`query_window` splits a long window into range queries
Prometheus accepts (at most 11,000 points per series).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from stormwatch.chaos.soak.report import FiredAlert, NearEvent, PendingAlert, SoakEvent, Stretch
from stormwatch.clients.prometheus import PrometheusAPI, Series

#: Labels of an ``ALERTS`` series that are not the alert's own.
NOT_ALERT_LABELS = frozenset({"__name__", "alertname", "alertstate"})
#: Points per range query, under Prometheus's limit of 11,000 per series.
MAX_POINTS = 10_000
#: A gap longer than this many evaluation intervals splits two stretches of one series.
GAP_INTERVALS = 1.5

AlertKey = tuple[str, tuple[tuple[str, str], ...]]


def alert_key(labels: Mapping[str, str]) -> AlertKey:
    """``(alertname, sorted own labels)`` of an ``ALERTS`` series (its state left out)."""
    own = tuple(sorted((k, v) for k, v in labels.items() if k not in NOT_ALERT_LABELS))
    return labels.get("alertname", ""), own


def sample_times(series: Iterable[Series]) -> dict[AlertKey, list[float]]:
    """Per alert, the sorted times of its samples over ``series`` (several chunks of one
    window, or several series of one alert, are merged)."""
    times: dict[AlertKey, set[float]] = {}
    for one in series:
        times.setdefault(alert_key(one.labels), set()).update(t for t, _ in one.points)
    return {key: sorted(found) for key, found in times.items() if found}


def stretches(times: Sequence[float], step: float) -> list[tuple[float, float]]:
    """``(first, last)`` of each run of ``times`` without a gap above
    :data:`GAP_INTERVALS` x ``step``; ``times`` sorted."""
    runs: list[tuple[float, float]] = []
    for t in times:
        if runs and t - runs[-1][1] <= GAP_INTERVALS * step:
            runs[-1] = (runs[-1][0], t)
        else:
            runs.append((t, t))
    return runs


def _near(event: SoakEvent, at: float) -> NearEvent:
    return NearEvent(
        kind=event.kind, at=event.at, detail=event.detail, offset_seconds=at - event.at
    )


def nearest_event(events: Sequence[SoakEvent], at: float) -> NearEvent | None:
    """The event closest in time to ``at`` (the earlier of two as close); None without events."""
    if not events:
        return None
    best = min(events, key=lambda e: (abs(at - e.at), e.at))
    return _near(best, at)


def preceding_event(events: Sequence[SoakEvent], at: float) -> NearEvent | None:
    """The latest event at or before ``at``; None when every event came after it."""
    before = [e for e in events if e.at <= at]
    return _near(max(before, key=lambda e: e.at), at) if before else None


def count_alerts(
    firing: Iterable[Series],
    pending: Iterable[Series],
    events: Sequence[SoakEvent],
    *,
    step: float,
    window_start: float,
) -> tuple[list[FiredAlert], list[PendingAlert]]:
    """The alerts that fired in the window and those only pending, each sorted by its first
    sample (module docstring).

    Args:
        firing / pending: range results of ``ALERTS{alertstate="firing"}`` and
            ``ALERTS{alertstate="pending"}`` over the window, at ``step``.
        events: the soak's events, to place each alert against.
        step: the range queries' step (the rule evaluation interval), seconds.
        window_start: the window's first evaluation (an alert firing there was already
            firing when the soak started).
    """
    fired: list[FiredAlert] = []
    fired_keys = set()
    for key, times in sample_times(firing).items():
        fired_keys.add(key)
        name, labels = key
        runs = stretches(times, step)
        fired.append(
            FiredAlert(
                alertname=name,
                labels=dict(labels),
                first_firing=times[0],
                last_firing=times[-1],
                firing_seconds=len(times) * step,
                episodes=len(runs),
                stretches=[
                    Stretch(first=first, last=last, nearest=nearest_event(events, first))
                    for first, last in runs
                ],
                firing_at_start=times[0] <= window_start + step / 2,
                nearest=nearest_event(events, times[0]),
                preceding=preceding_event(events, times[0]),
            )
        )
    pending_only = [
        PendingAlert(
            alertname=key[0],
            labels=dict(key[1]),
            first_pending=times[0],
            last_pending=times[-1],
            nearest=nearest_event(events, times[0]),
        )
        for key, times in sample_times(pending).items()
        if key not in fired_keys
    ]
    fired.sort(key=lambda a: (a.first_firing, a.alertname))
    pending_only.sort(key=lambda a: (a.first_pending, a.alertname))
    return fired, pending_only


def phase_passes(series: Iterable[Series], step: float) -> list[tuple[float, float]]:
    """The stretches in which a phase gauge (e.g. the job's ``eval`` deadline ``> 0``) had
    samples: ``(first, last + step)`` each, in time order, every series merged."""
    times = sorted({t for one in series for t, _ in one.points})
    return [(first, last + step) for first, last in stretches(times, step)]


def query_window(
    prometheus: PrometheusAPI, expr: str, *, start: float, end: float, step: float
) -> list[Series]:
    """``expr`` over ``[start, end]`` at ``step``, in as many range queries as Prometheus's
    point limit needs (:data:`MAX_POINTS`); the chunks' series are returned as they come
    (:func:`sample_times` merges them).

    Raises:
        PrometheusAPIError: a query failed.
    """
    found: list[Series] = []
    chunk = step * (MAX_POINTS - 1)
    at = start
    while at <= end:
        last = min(end, at + chunk)
        found.extend(prometheus.query_range(expr, start=at, end=last, step=step))
        at = last + step
    return found


__all__ = [
    "GAP_INTERVALS",
    "MAX_POINTS",
    "NOT_ALERT_LABELS",
    "alert_key",
    "count_alerts",
    "nearest_event",
    "phase_passes",
    "preceding_event",
    "query_window",
    "sample_times",
    "stretches",
]
