"""stormwatch.plan: resilience planning at scale (goodput from detect/recover times).

From failure rates per root-cause category (:mod:`.inputs`; default the Llama 3
paper's Table 5, :file:`llama3_table5.yaml`), checkpoint and restart costs and
per-category times to detect and recover (defaults, flags, or measured chaos
post-mortems, :mod:`.postmortems`), compute Young's and Daly's optimal
checkpoint intervals and the effective training time ratio (ETTR) analytically
(:mod:`.model`) and by seeded Monte Carlo (:mod:`.montecarlo`), for the
baseline and what-ifs (:mod:`.whatif`), and the downtime budget for 97% ETTR on
9,600 GPUs (:mod:`.planner`). :mod:`.report` writes Markdown, JSON and PNGs
(:mod:`.plots`); ``stormwatch plan`` is :mod:`.cli`.

Exceptions (all :class:`stormwatch.errors.StormwatchError`)::

    PlanError                   the planner could not do something (e.g. write the report)
    └── InvalidPlanInput        an input is invalid; names the field (also a ConfigError: exit 2)
"""

from stormwatch.plan.errors import InvalidPlanInput, PlanError
from stormwatch.plan.inputs import (
    CategoryTimes,
    FailureCategory,
    FailureTable,
    PlanSettings,
    load_failure_table,
    make_settings,
    resolve_times,
)
from stormwatch.plan.model import (
    daly_interval,
    ettr_first_order,
    ettr_renewal,
    solve_downtime_for_target,
    young_interval,
)
from stormwatch.plan.montecarlo import MonteCarloResult, simulate_ettr
from stormwatch.plan.planner import PlanReport, build_plan, solve_target
from stormwatch.plan.postmortems import read_postmortems
from stormwatch.plan.report import render_markdown, write_report
from stormwatch.plan.whatif import Scenario, ScenarioResult, build_scenarios

__all__ = [
    "CategoryTimes",
    "FailureCategory",
    "FailureTable",
    "InvalidPlanInput",
    "MonteCarloResult",
    "PlanError",
    "PlanReport",
    "PlanSettings",
    "Scenario",
    "ScenarioResult",
    "build_plan",
    "build_scenarios",
    "daly_interval",
    "ettr_first_order",
    "ettr_renewal",
    "load_failure_table",
    "make_settings",
    "read_postmortems",
    "render_markdown",
    "resolve_times",
    "simulate_ettr",
    "solve_downtime_for_target",
    "solve_target",
    "write_report",
    "young_interval",
]
