"""Put the inputs, the models and the what-ifs together into one :class:`PlanReport`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.plan.inputs import CategoryTimes, FailureTable, PlanSettings, resolve_times
from stormwatch.plan.model import daly_interval, ettr_renewal, solve_downtime_for_target
from stormwatch.plan.postmortems import MeasuredTimes
from stormwatch.plan.whatif import Scenario, ScenarioResult, build_scenarios, evaluate

#: The ByteRobust what-if: 97% ETTR on a 9,600-GPU, three-month job
#: (ByteRobust, arXiv:2509.16293).
TARGET_GPUS, TARGET_DAYS, TARGET_ETTR = 9600, 90.0, 0.97


class CategoryRow(BaseModel):
    """One failure category with its share and resolved times (s)."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    count: int
    share: float
    hardware: bool
    detect_s: float
    recover_s: float
    source: str


class TargetRow(BaseModel):
    """Downtime budget per failure to reach the target ETTR with a given checkpoint cost.

    ``max_downtime_s`` is the largest detect + recover + load per failure (s)
    that still reaches the target at Daly's interval (renewal model); ``None``
    when even zero downtime misses it (``ceiling_ettr`` is the best possible).
    """

    model_config = ConfigDict(frozen=True)

    label: str
    checkpoint_write_s: float
    checkpoint_load_s: float
    daly_interval_s: float
    ceiling_ettr: float
    max_downtime_s: float | None
    max_detect_plus_recover_s: float | None
    current_downtime_s: float


class TargetSolution(BaseModel):
    """Detect + recover time needed for ``target_ettr`` on ``gpus`` GPUs."""

    model_config = ConfigDict(frozen=True)

    gpus: int
    days: float
    target_ettr: float
    mttf_hours: float
    rows: list[TargetRow]


class PlanReport(BaseModel):
    """Everything ``stormwatch plan`` found; ``report.json`` is this model."""

    model_config = ConfigDict(frozen=True)

    source: str
    table_gpus: int
    table_days: float
    table_failures: int
    per_gpu_rate_per_hour: float
    settings: PlanSettings
    mttf_hours: float
    expected_failures: float
    categories: list[CategoryRow]
    scenarios: list[ScenarioResult]
    target: TargetSolution
    postmortems_used: list[str] = Field(default_factory=list)
    postmortems_skipped: list[str] = Field(default_factory=list)
    plots: list[str] = Field(default_factory=list)


def solve_target(
    table: FailureTable,
    scenarios: list[tuple[str, float, float, float]],
    *,
    gpus: int = TARGET_GPUS,
    days: float = TARGET_DAYS,
    target: float = TARGET_ETTR,
) -> TargetSolution:
    """Solve the downtime budget for each ``(label, write_s, load_s, current_downtime_s)``."""
    mttf_h = table.job_mttf_hours(gpus)
    mttf_s = mttf_h * 3600.0
    rows = []
    for label, delta, load, current in scenarios:
        tau = daly_interval(delta, mttf_s)
        budget = solve_downtime_for_target(target, delta, mttf_s)
        rows.append(
            TargetRow(
                label=label,
                checkpoint_write_s=delta,
                checkpoint_load_s=load,
                daly_interval_s=tau,
                ceiling_ettr=ettr_renewal(tau, delta, mttf_s, 0.0),
                max_downtime_s=budget,
                max_detect_plus_recover_s=None if budget is None else max(0.0, budget - load),
                current_downtime_s=current,
            )
        )
    return TargetSolution(gpus=gpus, days=days, target_ettr=target, mttf_hours=mttf_h, rows=rows)


def build_plan(
    table: FailureTable,
    settings: PlanSettings,
    measured: MeasuredTimes | None = None,
) -> tuple[PlanReport, list[Scenario]]:
    """Resolve times, evaluate every what-if, solve the ByteRobust target.

    Returns:
        The report and the scenarios it evaluated (for :mod:`.plots`).

    Raises:
        InvalidPlanInput: an override or a measurement names an unknown category.
    """
    times: dict[str, CategoryTimes] = resolve_times(
        table, settings, measured.times if measured else None
    )
    scenarios = build_scenarios(table, settings, times)
    results = [evaluate(s, table, settings) for s in scenarios]
    mttf_h = table.job_mttf_hours(settings.gpus)
    probs = table.probabilities()
    categories = [
        CategoryRow(
            id=c.id,
            name=c.name,
            count=c.count,
            share=p,
            hardware=c.hardware,
            detect_s=times[c.id].detect_s,
            recover_s=times[c.id].recover_s,
            source=times[c.id].source,
        )
        for c, p in zip(table.categories, probs, strict=True)
    ]
    target = solve_target(
        table,
        [
            (s.name, s.checkpoint_write_s, s.checkpoint_load_s, s.mean_downtime(table))
            for s in scenarios
            if s.name in ("baseline", "in-memory checkpoints", "all of the above")
        ],
    )
    report = PlanReport(
        source=table.source,
        table_gpus=table.gpus,
        table_days=table.days,
        table_failures=table.count,
        per_gpu_rate_per_hour=table.per_gpu_rate_per_hour(),
        settings=settings,
        mttf_hours=mttf_h,
        expected_failures=settings.days * 24.0 / mttf_h,
        categories=categories,
        scenarios=results,
        target=target,
        postmortems_used=measured.used if measured else [],
        postmortems_skipped=measured.skipped if measured else [],
    )
    return report, scenarios


__all__ = ["CategoryRow", "PlanReport", "TargetRow", "TargetSolution", "build_plan", "solve_target"]
