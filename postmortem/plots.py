"""Every post-mortem figure, drawn here once (matplotlib's object API: no pyplot, no global
backend; matplotlib is imported when a figure is drawn, not with this module).

* :func:`plot_loss` (an experiment's ``loss.png``): rank 0's loss per step against the
  fault-free baseline, with the fault and the step the job resumed from marked, so a
  reader sees at a glance that the recomputed steps retrace the baseline.
* :func:`plot_time_series` (an incident's ``step_time.png``, ``throughput.png``,
  ``heartbeats.png``): one :class:`Panel` of series over wall-clock time with the
  incident's moments (onset, alert, restart, recovery) as vertical lines.
* :func:`png_data_uri`: a PNG inlined into the self-contained HTML page.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.postmortem.progress import RankProgress


def plot_loss(
    experiment: RankProgress,
    baseline: RankProgress | None,
    path: Path,
    *,
    fault_step: int | None = None,
    resumed_from_step: int | None = None,
    title: str = "loss per step",
) -> Path:
    """Write a PNG of rank 0's loss per step (experiment vs baseline) to ``path``.

    Args:
        experiment: the experiment's rank 0; each worker incarnation is drawn separately.
        baseline: the fault-free run's rank 0, or None.
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
        for i, seg in enumerate(baseline.loss_segments()):
            ax.plot(
                *zip(*seg, strict=True), color="0.6", lw=3, label="baseline" if i == 0 else None
            )
    for i, seg in enumerate(experiment.loss_segments()):
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
