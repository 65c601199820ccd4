"""What-if scenarios and their evaluation (analytic models + Monte Carlo).

A :class:`Scenario` is the baseline with some costs changed:

* ``faster detection``: every detect time x ``detect_factor`` (0.5).
* ``faster restart``: every relaunch (``restart_s``) x ``restart_factor`` (0.5).
* ``in-memory checkpoints``: write and load times from host/peer memory
  (``in_memory_write_s``, ``in_memory_load_s``).
* ``hot spares``: hardware failures swap in an already-running spare
  (``replace_s`` becomes ``spare_swap_s``), so recover = restart + swap.
* ``all of the above``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from stormwatch.plan.errors import InvalidPlanInput
from stormwatch.plan.inputs import CategoryTimes, FailureTable, PlanSettings
from stormwatch.plan.model import (
    daly_interval,
    ettr_first_order,
    ettr_renewal,
    young_interval,
)
from stormwatch.plan.montecarlo import MonteCarloResult, simulate_ettr

#: Most failures per simulated run (one numpy step each; keeps a plan to seconds).
MAX_SIMULATED_FAILURES = 100_000


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Costs to evaluate: checkpoint write/load (s) and detect/recover times per category."""

    name: str
    description: str
    checkpoint_write_s: float
    checkpoint_load_s: float
    times: dict[str, CategoryTimes]

    def downtimes(self, table: FailureTable) -> list[float]:
        """Seconds down per failure (detect + recover + load), per category in table order."""
        return [
            self.times[c.id].detect_s + self.times[c.id].recover_s + self.checkpoint_load_s
            for c in table.categories
        ]

    def mean_downtime(self, table: FailureTable) -> float:
        """Failure-weighted mean downtime per failure (s)."""
        return sum(p * d for p, d in zip(table.probabilities(), self.downtimes(table), strict=True))

    def mean_detect(self, table: FailureTable) -> float:
        return sum(
            p * self.times[c.id].detect_s
            for p, c in zip(table.probabilities(), table.categories, strict=True)
        )


def _scaled(times: dict[str, CategoryTimes], **factors: float) -> dict[str, CategoryTimes]:
    return {
        k: t.model_copy(update={f: getattr(t, f) * x for f, x in factors.items()})
        for k, t in times.items()
    }


def _spares(
    times: dict[str, CategoryTimes], table: FailureTable, swap_s: float
) -> dict[str, CategoryTimes]:
    return {
        c.id: times[c.id].model_copy(update={"replace_s": min(times[c.id].replace_s, swap_s)})
        if c.hardware
        else times[c.id]
        for c in table.categories
    }


def build_scenarios(
    table: FailureTable,
    settings: PlanSettings,
    times: dict[str, CategoryTimes],
    *,
    detect_factor: float = 0.5,
    restart_factor: float = 0.5,
) -> list[Scenario]:
    """Baseline plus the what-ifs listed in the module docstring, in table order."""
    base = Scenario(
        name="baseline",
        description="current settings",
        checkpoint_write_s=settings.checkpoint_write_s,
        checkpoint_load_s=settings.checkpoint_load_s,
        times=times,
    )
    mem = {
        "checkpoint_write_s": settings.in_memory_write_s,
        "checkpoint_load_s": settings.in_memory_load_s,
    }
    spares = _spares(times, table, settings.spare_swap_s)
    combined = _spares(
        _scaled(times, detect_s=detect_factor, restart_s=restart_factor),
        table,
        settings.spare_swap_s,
    )
    return [
        base,
        Scenario(
            name="faster detection",
            description=f"detect x{detect_factor:g}",
            checkpoint_write_s=base.checkpoint_write_s,
            checkpoint_load_s=base.checkpoint_load_s,
            times=_scaled(times, detect_s=detect_factor),
        ),
        Scenario(
            name="faster restart",
            description=f"relaunch x{restart_factor:g}",
            checkpoint_write_s=base.checkpoint_write_s,
            checkpoint_load_s=base.checkpoint_load_s,
            times=_scaled(times, restart_s=restart_factor),
        ),
        Scenario(
            name="in-memory checkpoints",
            description=f"write {settings.in_memory_write_s:g} s, load {settings.in_memory_load_s:g} s",
            times=times,
            **mem,
        ),
        Scenario(
            name="hot spares",
            description=f"node swap {settings.spare_swap_s:g} s",
            checkpoint_write_s=base.checkpoint_write_s,
            checkpoint_load_s=base.checkpoint_load_s,
            times=spares,
        ),
        Scenario(name="all of the above", description="all four together", times=combined, **mem),
    ]


class McSummary(BaseModel):
    """Monte Carlo ETTR: mean and 95% confidence interval over ``replicas`` runs."""

    model_config = ConfigDict(frozen=True)

    mean: float
    ci_low: float
    ci_high: float
    replicas: int
    mean_failures: float

    @classmethod
    def of(cls, r: MonteCarloResult) -> McSummary:
        return cls(
            mean=r.mean,
            ci_low=r.ci_low,
            ci_high=r.ci_high,
            replicas=r.replicas,
            mean_failures=r.mean_failures,
        )


class ScenarioResult(BaseModel):
    """One row of the what-if table (times in s, ETTR in [0, 1])."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    checkpoint_write_s: float
    checkpoint_load_s: float
    mean_detect_s: float
    mean_downtime_s: float
    interval_s: float
    ettr_first_order: float
    ettr_renewal: float
    mc: McSummary
    young_interval_s: float
    daly_interval_s: float
    ettr_first_order_opt: float
    ettr_renewal_opt: float
    mc_opt: McSummary
    gpu_hours_lost_opt: float


def evaluate(scenario: Scenario, table: FailureTable, settings: PlanSettings) -> ScenarioResult:
    """Analytic and simulated ETTR at the current interval and at Daly's optimum.

    Raises:
        InvalidPlanInput: more than :data:`MAX_SIMULATED_FAILURES` failures expected per run.
    """
    mttf_s = table.job_mttf_hours(settings.gpus) * 3600.0
    expected_failures = settings.days * 86400.0 / mttf_s
    if expected_failures > MAX_SIMULATED_FAILURES:
        raise InvalidPlanInput(
            f"gpus/days: {expected_failures:,.0f} failures expected per run, more than the "
            f"{MAX_SIMULATED_FAILURES:,} the Monte Carlo simulates; plan a shorter run (--days)"
        )
    delta, down = scenario.checkpoint_write_s, scenario.mean_downtime(table)
    daly = daly_interval(delta, mttf_s)

    def mc(tau: float) -> McSummary:
        return McSummary.of(
            simulate_ettr(
                interval_s=tau,
                checkpoint_write_s=delta,
                mttf_s=mttf_s,
                downtimes_s=scenario.downtimes(table),
                probabilities=table.probabilities(),
                horizon_s=settings.days * 86400.0,
                replicas=settings.replicas,
                seed=settings.seed,
            )
        )

    opt = ettr_renewal(daly, delta, mttf_s, down)
    return ScenarioResult(
        name=scenario.name,
        description=scenario.description,
        checkpoint_write_s=delta,
        checkpoint_load_s=scenario.checkpoint_load_s,
        mean_detect_s=scenario.mean_detect(table),
        mean_downtime_s=down,
        interval_s=settings.interval_s,
        ettr_first_order=ettr_first_order(settings.interval_s, delta, mttf_s, down),
        ettr_renewal=ettr_renewal(settings.interval_s, delta, mttf_s, down),
        mc=mc(settings.interval_s),
        young_interval_s=young_interval(delta, mttf_s),
        daly_interval_s=daly,
        ettr_first_order_opt=ettr_first_order(daly, delta, mttf_s, down),
        ettr_renewal_opt=opt,
        mc_opt=mc(daly),
        gpu_hours_lost_opt=(1.0 - opt) * settings.gpus * settings.days * 24.0,
    )


__all__ = ["McSummary", "Scenario", "ScenarioResult", "build_scenarios", "evaluate"]
