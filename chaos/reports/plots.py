"""Plots for post-mortems (matplotlib's object API: no pyplot, no global backend).

``loss.png``: the experiment's loss per step against the fault-free baseline,
with the fault and the step the job resumed from marked, so a reader sees at a
glance that the recomputed steps retrace the baseline.

:func:`plot_time_series`: one panel of series over wall-clock time with the
incident's moments (fault, alert, restart, recovery) as vertical lines; the
incident post-mortems of ``stormwatch alerts`` draw step time, throughput and
per-rank heartbeats with it.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.trainer.telemetry.events import StartEvent, StepEvent
from stormwatch.trainer.telemetry.ranklogs import RankLog


def _series(log: RankLog) -> list[list[tuple[int, float]]]:
    """(step, loss) per process incarnation, in file order (a ``start`` begins a new one)."""
    segments: list[list[tuple[int, float]]] = [[]]
    for event in log.events:
        if isinstance(event, StartEvent) and segments[-1]:
            segments.append([])
        elif isinstance(event, StepEvent) and event.step is not None and event.loss is not None:
            segments[-1].append((event.step, event.loss))
    return [s for s in segments if s]


def plot_loss(
    experiment: RankLog,
    baseline: RankLog | None,
    path: Path,
    *,
    fault_step: int | None = None,
    resumed_from_step: int | None = None,
    title: str = "loss per step",
) -> Path:
    """Write a PNG of rank 0's loss per step (experiment vs baseline) to ``path``.

    Args:
        experiment: the experiment's rank-0 log; each incarnation is drawn separately.
        baseline: the fault-free run's rank-0 log, or None.
        fault_step: last step completed before the fault (a dashed vertical line).
        resumed_from_step: checkpoint step the job resumed from (a dotted line).

    Returns:
        ``path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if baseline is not None:
        for i, seg in enumerate(_series(baseline)):
            ax.plot(
                *zip(*seg, strict=True), color="0.6", lw=3, label="baseline" if i == 0 else None
            )
    for i, seg in enumerate(_series(experiment)):
        label = "experiment" if i == 0 else f"experiment after restart {i}"
        ax.plot(*zip(*seg, strict=True), marker=".", ms=4, lw=1, label=label)
    if fault_step is not None:
        ax.axvline(
            fault_step, color="tab:red", ls="--", lw=1, label=f"fault after step {fault_step}"
        )
    if resumed_from_step is not None:
        ax.axvline(
            resumed_from_step,
            color="tab:green",
            ls=":",
            lw=1,
            label=f"resumed from step {resumed_from_step}",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("loss (global mean, rank 0)")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


@dataclass(frozen=True)
class Line:
    """One series: ``(x, y)`` points (x in Unix seconds); ``marker_only`` draws dots, no line."""

    label: str
    points: Sequence[tuple[float, float]]
    marker_only: bool = False


@dataclass(frozen=True)
class Marker:
    """A moment drawn as a vertical line (Unix seconds)."""

    at: float
    label: str
    color: str = "tab:red"


@dataclass(frozen=True)
class Panel:
    """One figure: ``lines`` against seconds since ``origin``; ``ylabel`` names unit and source."""

    title: str
    ylabel: str
    origin: float
    lines: Sequence[Line] = ()
    markers: Sequence[Marker] = field(default_factory=tuple)


_MARKER_STYLES = ("--", ":", "-.", (0, (5, 1)), (0, (1, 3)))


def plot_time_series(panel: Panel, path: Path) -> Path:
    """Write ``panel`` as a PNG to ``path`` (x: seconds since ``panel.origin``).

    A panel without points still renders, with "no data" written in it.

    Returns:
        ``path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    drawn = False
    for line in panel.lines:
        if not line.points:
            continue
        xs = [x - panel.origin for x, _ in line.points]
        ys = [y for _, y in line.points]  # NaN breaks the line (e.g. at a restart)
        if line.marker_only:
            ax.plot(xs, ys, ls="", marker="|", ms=9, label=line.label)
        else:
            ax.plot(xs, ys, marker=".", ms=3, lw=1, label=line.label)
        drawn = drawn or any(y == y for y in ys)
    if not drawn:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for i, marker in enumerate(panel.markers):
        ax.axvline(
            marker.at - panel.origin,
            color=marker.color,
            ls=_MARKER_STYLES[i % len(_MARKER_STYLES)],
            lw=1.2,
            label=marker.label,
        )
    ax.set_xlabel("seconds since the incident's onset")
    ax.set_ylabel(panel.ylabel)
    ax.set_title(panel.title)
    if drawn or panel.markers:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def png_data_uri(path: Path) -> str:
    """``data:image/png;base64,...`` of a PNG file, to inline it in a self-contained HTML page."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


__all__ = ["Line", "Marker", "Panel", "plot_loss", "plot_time_series", "png_data_uri"]
