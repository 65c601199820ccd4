"""Plots for post-mortems (matplotlib's object API: no pyplot, no global backend).

``loss.png``: the experiment's loss per step against the fault-free baseline,
with the fault and the step the job resumed from marked, so a reader sees at a
glance that the recomputed steps retrace the baseline.
"""

from __future__ import annotations

from pathlib import Path

from stormwatch.chaos.ranklogs import RankLog


def _series(log: RankLog) -> list[list[tuple[int, float]]]:
    """(step, loss) per process incarnation, in file order (a ``start`` begins a new one)."""
    segments: list[list[tuple[int, float]]] = [[]]
    for event in log.events:
        if event.event == "start" and segments[-1]:
            segments.append([])
        elif event.event == "step" and event.step is not None and event.loss is not None:
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


__all__ = ["plot_loss"]
