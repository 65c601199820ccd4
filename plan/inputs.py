"""Planner inputs: the failure table (rates per root-cause category) and the settings.

The default failure table is :file:`llama3_table5.yaml`: the 419 unexpected
interruptions of Llama 3 405B pre-training on 16,384 H100 GPUs over 54 days
(arXiv:2407.21783, Table 5). The failure rate scales linearly with GPU count:
the per-GPU rate is ``total / (gpus * hours)`` of the table.

Per category the planner needs a time to detect and a time to recover (detection
to job relaunched, before the checkpoint load). Defaults (:class:`PlanSettings`):

* detect: ``detect_s`` (60 s: a crashed process or an Xid error is noticed by
  the launcher or a node health check within about a minute), except hangs
  (:data:`HANG_CATEGORIES`), which are noticed only when a collective times out:
  ``hang_detect_s`` (600 s, PyTorch's default NCCL process-group timeout).
* recover: ``restart_s`` (180 s: reschedule, start processes, form NCCL
  communicators) plus, for hardware categories, ``replace_s`` (300 s: cordon the
  node and bring in a replacement from the pool).

Both are overridable per category (``--detect CAT=S``, ``--recover CAT=S``) or
from measured post-mortems (:mod:`.postmortems`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stormwatch.plan.errors import InvalidPlanInput, from_validation_error

#: Categories of the default table that are hangs (detected by a collective timeout).
HANG_CATEGORIES: frozenset[str] = frozenset(
    {"nccl_watchdog_timeouts", "network_switch_cable", "nic"}
)

_Slug = Annotated[str, Field(pattern=r"^[a-z0-9_]+$")]


class FailureCategory(BaseModel):
    """One root-cause category: how often it interrupted the job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: _Slug
    name: str
    count: int = Field(ge=0, description="interruptions observed over the table's period")
    hardware: bool = Field(
        default=True, description="recovery needs a node taken out of the job (a spare helps)"
    )


class FailureTable(BaseModel):
    """Observed interruptions per category on ``gpus`` GPUs over ``days`` days."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    source: str
    gpus: int = Field(gt=0)
    days: float = Field(gt=0)
    total: int | None = Field(
        default=None, ge=0, description="stated total, checked against the sum"
    )
    categories: list[FailureCategory] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> FailureTable:
        ids = [c.id for c in self.categories]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"categories: duplicate id(s) {dupes}")
        if self.total is not None and self.total != self.count:
            raise ValueError(f"total: {self.total} but the categories sum to {self.count}")
        if self.count == 0:
            raise ValueError("categories: all counts are 0 (no failure rate to plan with)")
        return self

    @property
    def count(self) -> int:
        """Sum of the category counts."""
        return sum(c.count for c in self.categories)

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.categories]

    def category(self, cat_id: str) -> FailureCategory:
        """The category ``cat_id``; raises :class:`InvalidPlanInput` listing the valid ids."""
        for c in self.categories:
            if c.id == cat_id:
                return c
        raise InvalidPlanInput(f"unknown category {cat_id!r}; valid: {', '.join(self.ids)}")

    def per_gpu_rate_per_hour(self) -> float:
        """Failures per GPU-hour: ``count / (gpus * days * 24)``."""
        return self.count / (self.gpus * self.days * 24.0)

    def job_mttf_hours(self, gpus: int) -> float:
        """Job-level mean time to failure (h) on ``gpus`` GPUs (rate scales linearly)."""
        return 1.0 / (self.per_gpu_rate_per_hour() * gpus)

    def probabilities(self) -> list[float]:
        """Fraction of failures per category, in table order."""
        return [c.count / self.count for c in self.categories]


def load_failure_table(path: Path | None = None) -> FailureTable:
    """Read a failure table (YAML); ``None`` reads the bundled Llama 3 Table 5.

    Raises:
        InvalidPlanInput: unreadable file, bad YAML, or invalid content (names the field).
    """
    where = str(path) if path is not None else "llama3_table5.yaml"
    try:
        if path is None:
            text = resources.files("stormwatch.plan").joinpath("llama3_table5.yaml").read_text()
        else:
            text = path.read_text()
        raw = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InvalidPlanInput(f"{where}: cannot read failure table: {exc}") from exc
    if not isinstance(raw, dict):
        what = "is empty" if raw is None else f"holds a {type(raw).__name__}, not a mapping"
        raise InvalidPlanInput(
            f"{where}: the failure table {what}; it must be a YAML mapping with source, gpus, "
            "days and categories (a list of id, name, count), as the bundled "
            "llama3_table5.yaml (stormwatch/plan/llama3_table5.yaml)"
        )
    try:
        return FailureTable.model_validate(raw)
    except ValidationError as exc:
        raise from_validation_error(where, exc) from exc


class CategoryTimes(BaseModel):
    """Time to detect and to recover from one failure of a category (seconds).

    ``recover_s = restart_s + replace_s``: relaunching the job, plus (hardware)
    replacing the failed node. ``source`` says where the numbers came from.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    detect_s: float = Field(ge=0)
    restart_s: float = Field(ge=0)
    replace_s: float = Field(default=0.0, ge=0)
    source: str = "default"

    @property
    def recover_s(self) -> float:
        return self.restart_s + self.replace_s


class PlanSettings(BaseModel):
    """What to plan for. Seconds unless the name says otherwise.

    Defaults and why:
      * ``checkpoint_write_s`` 10: blocking part of an asynchronous sharded save
        (copy to host memory; the upload overlaps training).
      * ``checkpoint_load_s`` 60: read a sharded checkpoint back from storage.
      * ``interval_s`` 1800: checkpoint every 30 min, a common setting.
      * ``detect_s`` 60, ``hang_detect_s`` 600, ``restart_s`` 180, ``replace_s`` 300:
        see the module docstring.
      * ``in_memory_write_s`` 1, ``in_memory_load_s`` 10: checkpoints kept in host
        or peer memory (as in Gemini, SOSP 2023) for the what-if.
      * ``spare_swap_s`` 30: a hot spare is already up; swapping it in replaces ``replace_s``.

    Every number must be finite (``inf`` and ``nan`` are rejected: an infinite time makes
    the analytic and the simulated ETTR disagree, or the optimum undefined).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    gpus: int = Field(gt=0, description="GPUs in the job")
    days: float = Field(default=54.0, gt=0, description="wall-clock length of the run")
    interval_s: float = Field(default=1800.0, gt=0, description="current checkpoint interval")
    checkpoint_write_s: float = Field(default=10.0, gt=0)
    checkpoint_load_s: float = Field(default=60.0, ge=0)
    detect_s: float = Field(default=60.0, ge=0)
    hang_detect_s: float = Field(default=600.0, ge=0)
    restart_s: float = Field(default=180.0, ge=0)
    replace_s: float = Field(default=300.0, ge=0)
    in_memory_write_s: float = Field(default=1.0, gt=0)
    in_memory_load_s: float = Field(default=10.0, ge=0)
    spare_swap_s: float = Field(default=30.0, ge=0)
    detect_overrides: dict[str, float] = Field(default_factory=dict)
    recover_overrides: dict[str, float] = Field(default_factory=dict)
    replicas: int = Field(default=200, ge=2, le=100_000, description="Monte Carlo replicas")
    seed: int = 0

    @model_validator(mode="after")
    def _overrides_non_negative(self) -> PlanSettings:
        for name, table in (
            ("detect_overrides", self.detect_overrides),
            ("recover_overrides", self.recover_overrides),
        ):
            for cat, value in table.items():
                if not (value >= 0 and math.isfinite(value)):
                    raise ValueError(f"{name}.{cat}: must be a finite number >= 0 (got {value})")
        return self


def make_settings(names: Mapping[str, str] | None = None, **values: object) -> PlanSettings:
    """Build :class:`PlanSettings`, turning pydantic errors into :class:`InvalidPlanInput`.

    Args:
        names: field -> the command-line option that set it (errors then name the option).
        values: the settings.
    """
    try:
        return PlanSettings.model_validate(values)
    except ValidationError as exc:
        raise from_validation_error("plan settings", exc, names) from exc


def resolve_times(
    table: FailureTable,
    settings: PlanSettings,
    measured: dict[str, CategoryTimes] | None = None,
) -> dict[str, CategoryTimes]:
    """Detect/recover times per category: defaults < measured post-mortems < overrides.

    Raises:
        InvalidPlanInput: an override or measurement names a category not in ``table``.
    """
    for source in (settings.detect_overrides, settings.recover_overrides, measured or {}):
        for cat in source:
            table.category(cat)  # raises for unknown ids
    times: dict[str, CategoryTimes] = {}
    for c in table.categories:
        t = CategoryTimes(
            detect_s=settings.hang_detect_s if c.id in HANG_CATEGORIES else settings.detect_s,
            restart_s=settings.restart_s,
            replace_s=settings.replace_s if c.hardware else 0.0,
        )
        if measured and c.id in measured:
            t = measured[c.id]
        if c.id in settings.detect_overrides:
            t = t.model_copy(update={"detect_s": settings.detect_overrides[c.id], "source": "flag"})
        if c.id in settings.recover_overrides:
            update = {
                "restart_s": settings.recover_overrides[c.id],
                "replace_s": 0.0,
                "source": "flag",
            }
            t = t.model_copy(update=update)
        times[c.id] = t
    return times


__all__ = [
    "HANG_CATEGORIES",
    "CategoryTimes",
    "FailureCategory",
    "FailureTable",
    "PlanSettings",
    "load_failure_table",
    "make_settings",
    "resolve_times",
]
