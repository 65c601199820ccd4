"""What an incident post-mortem asks Prometheus: the job's step time, throughput and
heartbeats over the window (plots), and straggler scores and XID errors at its end (culprit).

Queried through the one Prometheus client (:class:`stormwatch.clients.PrometheusClient`);
any failure leaves the plots to the rank logs and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stormwatch.clients.http import HttpOptions

#: Most points per Prometheus range query (the step is widened to stay below it).
MAX_POINTS = 400
#: Seconds per request: Prometheus is on this host, and a dead one must not hold the report up.
QUERY_TIMEOUT_S = 5.0

#: name -> (PromQL with {job}, label keys naming a series).
RANGE_QUERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "step_seconds": (
        'max by (rank) (rate(stormwatch_train_step_duration_seconds_sum{{training_job="{job}"}}[15s])'
        ' / rate(stormwatch_train_step_duration_seconds_count{{training_job="{job}"}}[15s]))',
        ("rank",),
    ),
    # From the counter, not the last-step gauge: a hung job keeps its gauge at the
    # last step's rate, while the counter's rate falls to zero.
    "tokens_per_second": (
        'sum(rate(stormwatch_train_tokens_total{{training_job="{job}"}}[10s]))',
        (),
    ),
    "heartbeat_age_seconds": (
        'time() - max by (rank) (stormwatch_rank_last_progress_timestamp_seconds{{training_job="{job}"}})',
        ("rank",),
    ),
}
#: name -> (PromQL with {job} and {window} (seconds), label keys), evaluated at the end.
INSTANT_QUERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "straggler_score": (
        'max by (rank) (max_over_time(stormwatch_rank_straggler_score{{training_job="{job}"}}[{window}s]))',
        ("rank",),
    ),
    "xid_errors": (
        "sum by (node, gpu, code) (increase(stormwatch_gpu_xid_errors_total[{window}s])) > 0",
        ("node", "gpu", "code"),
    ),
}


@dataclass
class PrometheusFindings:
    """What Prometheus answered.

    Attributes:
        ranges: query name -> {series label text -> [(t, value)]} (empty after a failure).
        instants: query name -> {series label text -> value} at the window's end.
        what: the URL and step used, or the URL and why it failed.
    """

    ranges: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    instants: dict[str, dict[str, float]] = field(default_factory=dict)
    what: str = ""


def broken_at_gaps(points: list[tuple[float, float]], step: float) -> list[tuple[float, float]]:
    """``points`` (a range query's, ``step`` s apart) with a NaN point inside every gap of
    more than one step: Prometheus returns no point where a series had no sample (its
    ranks were gone during a restart), and a plot drew the outage as a slope (fresh-user
    finding); NaN breaks the line (:func:`stormwatch.postmortem.plots.plot_time_series`)."""
    out: list[tuple[float, float]] = []
    for t, v in points:
        if out and t - out[-1][0] > 1.5 * step:
            out.append(((out[-1][0] + t) / 2, float("nan")))
        out.append((t, v))
    return out


def _label_text(labels: dict[str, str], keys: tuple[str, ...]) -> str:
    return " ".join(f"{k}={labels[k]}" for k in keys if k in labels) or "all"


def read_prometheus(
    url: str, job: str, window: tuple[float, float], *, options: HttpOptions | None = None
) -> PrometheusFindings:
    """Run :data:`RANGE_QUERIES` over ``window`` (Unix s) and :data:`INSTANT_QUERIES` at its
    end for ``job``, reaching Prometheus with ``options`` (TLS, auth; None: plain HTTP);
    never raises: a failure is in ``what``."""
    from stormwatch.clients import PrometheusClient

    start, end = window
    found = PrometheusFindings()
    client = PrometheusClient(url, timeout=QUERY_TIMEOUT_S, options=options)
    step = max(1.0, (end - start) / MAX_POINTS)
    seconds = max(1, int(end - start))
    try:
        for name, (expr, keys) in RANGE_QUERIES.items():
            series = client.query_range(expr.format(job=job), start=start, end=end, step=step)
            found.ranges[name] = {
                _label_text(dict(s.labels), keys): broken_at_gaps(list(s.points), step)
                for s in series
            }
        for name, (expr, keys) in INSTANT_QUERIES.items():
            samples = client.query(expr.format(job=job, window=seconds), at=end)
            found.instants[name] = {_label_text(dict(s.labels), keys): s.value for s in samples}
    except Exception as exc:  # any failure: plots fall back to the rank logs
        found.ranges.clear()
        found.what = f"{url}: {exc}"
        return found
    found.what = f"{url} (range {step:g} s steps)"
    return found


__all__ = [
    "INSTANT_QUERIES",
    "RANGE_QUERIES",
    "PrometheusFindings",
    "broken_at_gaps",
    "read_prometheus",
]
