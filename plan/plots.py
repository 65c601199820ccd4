"""PNG plots for the plan report (matplotlib's object API: no pyplot, no global backend).

* ``ettr_vs_interval.png``: ETTR against the checkpoint interval for the
  baseline and the in-memory what-if (renewal and first-order models), with
  Monte Carlo means and 95% CIs at a few intervals, and the current, Young and
  Daly intervals marked.
* ``ettr_vs_gpus.png``: ETTR at Daly's interval against cluster size, baseline
  and every what-if (renewal model), with the planned size marked.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stormwatch.plan.inputs import FailureTable, PlanSettings
from stormwatch.plan.model import (
    daly_interval,
    ettr_first_order,
    ettr_renewal,
    young_interval,
)
from stormwatch.plan.montecarlo import simulate_ettr
from stormwatch.plan.whatif import Scenario

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _figure() -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def plot_ettr_vs_interval(
    table: FailureTable,
    settings: PlanSettings,
    scenarios: list[Scenario],
    path: Path,
    *,
    mc_points: int = 7,
) -> Path:
    """Write ``ettr_vs_interval.png`` to ``path`` (see module docstring); returns ``path``."""
    mttf_s = table.job_mttf_hours(settings.gpus) * 3600.0
    taus = np.geomspace(30.0, max(4 * 3600.0, 2 * settings.interval_s), 200)
    fig = _figure()
    ax = fig.add_subplot()
    for scenario, color in zip(scenarios, ("tab:blue", "tab:orange"), strict=False):
        delta, down = scenario.checkpoint_write_s, scenario.mean_downtime(table)
        ax.plot(
            taus / 60,
            [ettr_renewal(t, delta, mttf_s, down) for t in taus],
            color=color,
            label=f"{scenario.name} (renewal)",
        )
        ax.plot(
            taus / 60,
            [ettr_first_order(t, delta, mttf_s, down) for t in taus],
            color=color,
            ls="--",
            lw=1,
            label=f"{scenario.name} (first order)",
        )
        daly = daly_interval(delta, mttf_s)
        ax.axvline(
            daly / 60,
            color=color,
            ls=":",
            lw=1,
            label=f"Daly {daly / 60:.1f} min (Young {young_interval(delta, mttf_s) / 60:.1f})",
        )
        points = np.geomspace(taus[0], taus[-1], mc_points)
        sims = [
            simulate_ettr(
                interval_s=float(t),
                checkpoint_write_s=delta,
                mttf_s=mttf_s,
                downtimes_s=scenario.downtimes(table),
                probabilities=table.probabilities(),
                horizon_s=settings.days * 86400.0,
                replicas=min(settings.replicas, 100),
                seed=settings.seed,
            )
            for t in points
        ]
        ax.errorbar(
            points / 60,
            [s.mean for s in sims],
            yerr=[s.half_width for s in sims],
            fmt="o",
            ms=3,
            color=color,
            capsize=3,
            label=f"{scenario.name} (Monte Carlo, 95% CI)",
        )
    ax.axvline(
        settings.interval_s / 60,
        color="0.3",
        ls="-.",
        lw=1,
        label=f"current {settings.interval_s / 60:g} min",
    )
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (min of compute between checkpoints)")
    ax.set_ylabel("ETTR (productive / wall time)")
    ax.set_title(f"ETTR vs checkpoint interval, {settings.gpus:,} GPUs")
    ax.legend(loc="lower center", fontsize="x-small", ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def plot_ettr_vs_gpus(
    table: FailureTable,
    settings: PlanSettings,
    scenarios: list[Scenario],
    path: Path,
) -> Path:
    """Write ``ettr_vs_gpus.png`` to ``path`` (see module docstring); returns ``path``."""
    sizes = np.geomspace(256, max(131072, 2 * settings.gpus), 120)
    fig = _figure()
    ax = fig.add_subplot()
    for scenario in scenarios:
        delta, down = scenario.checkpoint_write_s, scenario.mean_downtime(table)
        ys = []
        for n in sizes:
            mttf_s = table.job_mttf_hours(int(n)) * 3600.0
            ys.append(ettr_renewal(daly_interval(delta, mttf_s), delta, mttf_s, down))
        ax.plot(sizes, ys, label=scenario.name)
    ax.axvline(settings.gpus, color="0.3", ls="-.", lw=1, label=f"planned {settings.gpus:,} GPUs")
    ax.set_xscale("log")
    ax.set_xlabel("GPUs in the job")
    ax.set_ylabel("ETTR at Daly's interval (renewal model)")
    ax.set_title("ETTR vs cluster size (failure rate per GPU from the table)")
    ax.legend(loc="lower left", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


__all__ = ["plot_ettr_vs_gpus", "plot_ettr_vs_interval"]
