"""The incident's three figures: step time, throughput and per-rank heartbeats around it.

From Prometheus's range queries when they returned data, else from the rank logs;
drawn by the engine (:func:`stormwatch.postmortem.plots.plot_time_series`) with the
incident's moments (onset, alert, restart action, restart, recovery, close) as lines.
"""

from __future__ import annotations

from pathlib import Path

from stormwatch.alerts.incident_report.sources import Inputs
from stormwatch.postmortem import IncidentPostMortem, PlotRef, StepDone, WorkerStart
from stormwatch.postmortem.plots import Line, Marker, Panel, plot_time_series

#: Window of the rank-log throughput (completed steps per second over the last N s).
RATE_WINDOW_S = 10.0
#: Most points of the rank-log throughput line.
RATE_POINTS = 400
#: The figures, in the order of the report (file ``<name>.png``).
PLOT_NAMES = ("step_time", "throughput", "heartbeats")


def _markers(pm: IncidentPostMortem) -> list[Marker]:
    moments = [
        (pm.onset_at, f"onset ({pm.onset_source})", "tab:red"),
        (pm.detected_at, "alert firing", "tab:orange"),
        (pm.restart_action_at, "responder restarted the workers", "tab:brown"),
        (pm.restarted_at, "restarted workers began training", "tab:purple"),
        (pm.recovered_at, "first step after resume", "tab:green"),
        (pm.resolved_at, "incident closed", "tab:gray"),
    ]
    return [Marker(at, label, color) for at, label, color in moments if at is not None]


def _throughput(inputs: Inputs) -> list[tuple[float, float]]:
    """Rank 0's completed steps per second over the last :data:`RATE_WINDOW_S`, on a grid."""
    start, end = inputs.window
    if not inputs.progress:
        return []
    first = inputs.progress[min(inputs.progress)]
    times = sorted(s.time for s in first.steps if start <= s.time <= end)
    rate: list[tuple[float, float]] = []
    if times:
        grid = max(1.0, (end - start) / RATE_POINTS)
        t = times[0]
        while t <= min(end, times[-1] + RATE_WINDOW_S):
            done = sum(1 for u in times if t - RATE_WINDOW_S < u <= t)
            rate.append((t, done / RATE_WINDOW_S))
            t += grid
    return rate


def _rank_log_panels(inputs: Inputs, origin: float, markers: list[Marker]) -> list[Panel]:
    """Step time, throughput and heartbeats from the rank logs; a line breaks at each
    worker restart (NaN points), so an outage is never drawn as a slope."""
    start, end = inputs.window
    step_time, beats = [], []
    for rank, progress in sorted(inputs.progress.items()):
        points: list[tuple[float, float]] = []
        for mark in progress.marks:
            if not start <= mark.time <= end:
                continue
            if isinstance(mark, WorkerStart):
                points.append((mark.time, float("nan")))
            elif isinstance(mark, StepDone) and mark.step_seconds:
                points.append((mark.time, mark.step_seconds))
        step_time.append(Line(f"rank {rank}", points))
        ticks = [(s.time, float(rank)) for s in progress.steps if start <= s.time <= end]
        beats.append(Line(f"rank {rank}", ticks, marker_only=True))
    return [
        Panel("Step time per rank", "step time (s, rank logs)", origin, step_time, markers),
        Panel(
            "Throughput",
            f"steps per second ({RATE_WINDOW_S:g} s window, rank logs)",
            origin,
            [Line("job", _throughput(inputs))],
            markers,
        ),
        Panel("Per-rank heartbeats (one tick per completed step)", "rank", origin, beats, markers),
    ]


def _prometheus_panels(inputs: Inputs, origin: float, markers: list[Marker]) -> list[Panel]:
    prom = inputs.prometheus

    def lines(name: str) -> list[Line]:
        return [Line(label, points) for label, points in sorted(prom.get(name, {}).items())]

    return [
        Panel(
            "Step time per rank",
            "mean step time (s, Prometheus)",
            origin,
            lines("step_seconds"),
            markers,
        ),
        Panel(
            "Throughput",
            "tokens per second (job, 10 s rate, Prometheus)",
            origin,
            lines("tokens_per_second"),
            markers,
        ),
        Panel(
            "Per-rank heartbeat age",
            "seconds since the last step (Prometheus)",
            origin,
            lines("heartbeat_age_seconds"),
            markers,
        ),
    ]


def write_plots(pm: IncidentPostMortem, inputs: Inputs, folder: Path) -> list[PlotRef]:
    """Draw step time, throughput and heartbeats around the incident into ``folder``.

    Prometheus range queries when they returned data, else the rank logs.
    """
    origin = pm.onset_at if pm.onset_at is not None else pm.detected_at
    markers = _markers(pm)
    use_prometheus = any(inputs.prometheus.get(name) for name in inputs.prometheus)
    source = "prometheus" if use_prometheus else "rank logs"
    panels = (_prometheus_panels if use_prometheus else _rank_log_panels)(inputs, origin, markers)
    refs = []
    for name, panel in zip(PLOT_NAMES, panels, strict=True):
        plot_time_series(panel, folder / f"{name}.png")
        refs.append(PlotRef(name=name, title=panel.title, file=f"{name}.png", source=source))
    return refs


__all__ = ["PLOT_NAMES", "RATE_WINDOW_S", "write_plots"]
