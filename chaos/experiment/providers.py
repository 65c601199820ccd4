"""Probe providers of the experiment language and the tolerance they are checked against.

Part of the experiment model (:mod:`stormwatch.chaos.experiment.model` re-exports every name);
evaluated by :mod:`stormwatch.chaos.execution.probes`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Tolerance(_Model):
    """What a probe's value must be: exactly one of the fields below.

    A bare number in the file means ``eq``. ``range`` is inclusive ``[low, high]``.
    Values are compared as floats; ``eq``/``ne`` compare exactly, which suits
    counts (``count(...) == 4``).
    """

    eq: float | None = None
    ne: float | None = None
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    range: list[float] | None = Field(default=None, min_length=2, max_length=2)

    @model_validator(mode="before")
    @classmethod
    def _bare_number_means_eq(cls, data: object) -> object:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"eq": float(data)}
        if not isinstance(data, (dict, Tolerance)):
            raise ValueError(
                "must be a number (exact value) or a mapping with exactly one of "
                f"eq, ne, gt, ge, lt, le, range (got {data!r})"
            )
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> Tolerance:
        given = [name for name in _TOLERANCE_OPS if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of eq, ne, gt, ge, lt, le, range "
                f"(or a bare number for eq); got {given or 'none'}"
            )
        if self.range is not None and self.range[0] > self.range[1]:
            raise ValueError(f"range must be [low, high] with low <= high (got {self.range})")
        return self

    def accepts(self, value: float) -> bool:
        """Whether ``value`` is within the tolerance (NaN is never accepted)."""
        if math.isnan(value):
            return False
        if self.eq is not None:
            return value == self.eq
        if self.ne is not None:
            return value != self.ne
        if self.gt is not None:
            return value > self.gt
        if self.ge is not None:
            return value >= self.ge
        if self.lt is not None:
            return value < self.lt
        if self.le is not None:
            return value <= self.le
        assert self.range is not None
        return self.range[0] <= value <= self.range[1]

    def describe(self) -> str:
        """Human form, e.g. ``== 4`` or ``in [1, 5]``."""
        for name, symbol in (
            ("eq", "=="),
            ("ne", "!="),
            ("gt", ">"),
            ("ge", ">="),
            ("lt", "<"),
            ("le", "<="),
        ):
            value = getattr(self, name)
            if value is not None:
                return f"{symbol} {_exact(value)}"
        assert self.range is not None
        return f"in [{_exact(self.range[0])}, {_exact(self.range[1])}]"


def _exact(value: float) -> str:
    """``value`` as written: ``4``, ``0.5``, ``1e+16``, and ``4.0000001`` rather than six
    digits' ``4`` (a bound printed rounded made a failing value read as a pass)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


_TOLERANCE_OPS = ("eq", "ne", "gt", "ge", "lt", "le", "range")


class PrometheusProvider(_Model):
    """A PromQL instant query; every sample of the result must be within ``tolerance``.

    An empty result never satisfies the tolerance (the series are absent).
    """

    type: Literal["prometheus"]
    query: str = Field(min_length=1, description="PromQL; may use ${job}, ${steps}, ...")
    tolerance: Tolerance


class JobProvider(_Model):
    """A condition read from the job's rank logs (``<job>/logs/rank<R>.jsonl``).

    ``progressing``: every rank of the job completed a step within the last
    ``window_seconds`` *and* after the experiment's latest fault (so a rank that
    was killed counts only once it steps again); a rank that finished counts as
    progressing, unless it finished before that fault (nothing recovered). ``finished``: every rank logged ``done`` (the job finished).
    """

    type: Literal["job"]
    expect: Literal["progressing", "finished"]
    window_seconds: float = Field(default=15.0, gt=0, le=3600)


class HttpProvider(_Model):
    """An HTTP GET that must answer ``status`` (and contain ``contains`` when given).

    For a service the job depends on (a dataset server, the responder's health
    endpoint, ...). A connection error or timeout is a failed check.
    """

    type: Literal["http"]
    url: str = Field(pattern=r"^https?://[^\s]+$", description="http(s) URL; may use ${job}")
    status: int = Field(default=200, ge=100, le=599)
    contains: str | None = None
    timeout_seconds: float = Field(default=5.0, gt=0, le=300)


class RanksProvider(_Model):
    """The number of the job's ranks the node agents see alive (``GET /v1/ranks``).

    ``tolerance`` as for Prometheus; e.g. ``tolerance: {ge: 4}``.
    """

    type: Literal["ranks"]
    tolerance: Tolerance


class ProgressProvider(_Model):
    """Training progress: every rank completed at least ``min_steps`` steps in the last
    ``window_seconds`` (from the rank logs); a rank that finished counts as progressing."""

    type: Literal["progress"]
    min_steps: int = Field(default=1, ge=1, le=100_000)
    window_seconds: float = Field(default=30.0, gt=0, le=3600)


class LossProvider(_Model):
    """Loss sanity on rank 0's log: the latest loss is finite, at most ``max`` when given,
    and at most ``max_ratio`` times the lowest loss logged so far (a divergence guard)."""

    type: Literal["loss"]
    max: float | None = Field(default=None, gt=0)
    max_ratio: float = Field(default=2.0, ge=1.0, le=1e6)


Provider = Annotated[
    PrometheusProvider
    | JobProvider
    | HttpProvider
    | RanksProvider
    | ProgressProvider
    | LossProvider,
    Field(discriminator="type"),
]


__all__ = [
    "HttpProvider",
    "JobProvider",
    "LossProvider",
    "ProgressProvider",
    "PrometheusProvider",
    "Provider",
    "RanksProvider",
    "Tolerance",
]
