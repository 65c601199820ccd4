"""The experiment model: steady-state hypothesis, method, rollbacks (chaostoolkit's shape).

An experiment file (YAML, ``version: 1``) is parsed once, at the edge, by
:func:`stormwatch.chaos.loader.load_experiment` into these frozen, strict
pydantic models (``extra="forbid"``: unknown keys are errors, and no type
coercion: ``rank: "1"`` is rejected). Example: ``experiments/kill-rank.yaml``.

Shape::

    version: 1
    title, description, tags
    job:                      what to train (the runner starts it, or attaches with --job)
    steady_state_hypothesis:  title + probes, checked before and after the method
    method:                   actions (carrying a typed fault), probes, pauses
    rollbacks:                revert / probe / pause activities
    rollback_strategy:        always (default) | deviated | never

Probe queries may use the placeholders ``${job}``, ``${steps}``,
``${checkpoint_every}`` and ``${world_size}``; the runner fills them in.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Placeholders a probe query may use (filled in by the runner at run time).
PLACEHOLDERS = ("job", "steps", "checkpoint_every", "world_size")
_PLACEHOLDER_RE = re.compile(r"\$\{([^}]*)\}")
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
#: Longest fault time-to-live: one day. A fault that must outlive a day is a mistake.
MAX_TTL_SECONDS = 86_400.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


_Name = Annotated[
    str,
    Field(
        pattern=_NAME_PATTERN,
        description="letters, digits, '_', '.', '-'; starts with a letter or digit; <= 64 chars",
    ),
]


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
                return f"{symbol} {value:g}"
        assert self.range is not None
        return f"in [{self.range[0]:g}, {self.range[1]:g}]"


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


Provider = Annotated[PrometheusProvider | JobProvider, Field(discriminator="type")]


PhaseName = Literal["before", "after"]
_BOTH_PHASES: tuple[PhaseName, ...] = ("before", "after")


class SteadyStateProbe(_Model):
    """A steady-state probe, checked before and/or after the method.

    ``timeout_seconds`` (default 0: one check) lets the probe poll, every
    ``poll_seconds``, until it holds: Prometheus scrapes lag by a scrape interval.
    """

    name: _Name
    provider: Provider
    timeout_seconds: float = Field(default=0.0, ge=0, le=86_400)
    poll_seconds: float = Field(default=1.0, gt=0, le=60)
    phases: list[PhaseName] = Field(default_factory=lambda: list(_BOTH_PHASES), min_length=1)


class SteadyStateHypothesis(_Model):
    """What "healthy" means, as probes that must all hold before and after the method."""

    title: str = Field(min_length=1)
    probes: list[SteadyStateProbe] = Field(min_length=1)


class KillRankFault(_Model):
    """Kill one rank's worker process (sent to the agent of the node that holds the rank).

    The kill itself cannot be undone; torchrun is expected to restart the
    workers. ``ttl_seconds`` bounds the agent-side fault record.
    """

    kind: Literal["kill_rank"]
    rank: int = Field(ge=0, le=65_535)
    signal: Literal["SIGKILL", "SIGTERM"] = "SIGKILL"
    ttl_seconds: float = Field(default=300.0, gt=0, le=MAX_TTL_SECONDS)


class FreezeRankFault(_Model):
    """Freeze one rank's worker with SIGSTOP; revert sends SIGCONT (controller-side).

    The controller signals the process directly (the lab shares one PID
    namespace); a detached reaper reverts it when ``ttl_seconds`` expire, even
    if the controller died.
    """

    kind: Literal["freeze_rank"]
    rank: int = Field(ge=0, le=65_535)
    ttl_seconds: float = Field(default=60.0, gt=0, le=MAX_TTL_SECONDS)


Fault = Annotated[KillRankFault | FreezeRankFault, Field(discriminator="kind")]


class When(_Model):
    """Hold an action until the job has completed ``step`` (rank logs), at most ``timeout_seconds``."""

    step: int = Field(ge=1)
    timeout_seconds: float = Field(default=600.0, gt=0, le=86_400)


class ActionActivity(_Model):
    """Inject ``fault`` (when the job reaches ``when.step``, or at once)."""

    type: Literal["action"]
    name: _Name
    fault: Fault
    when: When | None = None
    pause_after_seconds: float = Field(default=0.0, ge=0, le=3600)


class ProbeActivity(_Model):
    """Wait until a condition holds, at most ``timeout_seconds`` (fails otherwise)."""

    type: Literal["probe"]
    name: _Name
    provider: Provider
    timeout_seconds: float = Field(default=60.0, ge=0, le=86_400)
    poll_seconds: float = Field(default=1.0, gt=0, le=60)


class PauseActivity(_Model):
    """Sleep ``seconds``."""

    type: Literal["pause"]
    name: _Name
    seconds: float = Field(gt=0, le=3600)


class RevertActivity(_Model):
    """Revert open faults from the ledger: this experiment's (``experiment``) or every one (``all``)."""

    type: Literal["revert"]
    name: _Name
    scope: Literal["experiment", "all"] = "experiment"


MethodActivity = Annotated[
    ActionActivity | ProbeActivity | PauseActivity, Field(discriminator="type")
]
RollbackActivity = Annotated[
    RevertActivity | ProbeActivity | PauseActivity, Field(discriminator="type")
]


class JobSection(_Model):
    """What to train. The runner starts this job on the lab, unless ``--job`` attaches to one.

    ``startup_timeout_seconds`` bounds the wait until every rank has completed
    its first step (torch import + rendezvous take seconds on a loaded CPU).

    ``name`` is a base: each run that starts its own job names it
    ``<name>-<utc time>-<hex>`` (fresh logs and checkpoints every run).

    The shape is optional: ``world_size``, or ``nodes`` and ``nproc_per_node`` (world
    size = their product), fix the job's world size; then fault ranks are checked
    when the file is validated, and the run refuses a lab of another size. Without
    them, ranks are checked against the lab before anything is injected.
    """

    name: str = Field(default="experiment", pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")
    steps: int = Field(ge=1, le=1_000_000)
    checkpoint_every: int = Field(ge=1)
    step_delay: float = Field(default=0.0, ge=0, le=60)
    seed: int = Field(default=0, ge=0)
    startup_timeout_seconds: float = Field(default=300.0, gt=0, le=3600)
    world_size: int | None = Field(default=None, ge=1, le=4096)
    nodes: int | None = Field(default=None, ge=1, le=64)
    nproc_per_node: int | None = Field(default=None, ge=1, le=64)

    @property
    def fixed_world_size(self) -> int | None:
        """``world_size``, else ``nodes`` * ``nproc_per_node``; ``None`` when not fixed."""
        if self.world_size is not None:
            return self.world_size
        if self.nodes is not None and self.nproc_per_node is not None:
            return self.nodes * self.nproc_per_node
        return None


class Experiment(_Model):
    """A chaos experiment (see the module docstring for the file shape)."""

    version: Literal[1]
    title: str = Field(min_length=1)
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    job: JobSection
    steady_state_hypothesis: SteadyStateHypothesis
    method: list[MethodActivity] = Field(min_length=1)
    rollbacks: list[RollbackActivity] = Field(default_factory=list)
    rollback_strategy: Literal["always", "deviated", "never"] = "always"


def placeholders_in(text: str) -> list[str]:
    """Names used as ``${name}`` in ``text`` (in order, with repeats)."""
    return _PLACEHOLDER_RE.findall(text)


def expand(text: str, variables: dict[str, str]) -> str:
    """Replace ``${name}`` with ``variables[name]``.

    Raises:
        KeyError: a placeholder has no value (validation prevents this for experiments).
    """
    return _PLACEHOLDER_RE.sub(lambda m: variables[m.group(1)], text)


__all__ = [
    "MAX_TTL_SECONDS",
    "PLACEHOLDERS",
    "ActionActivity",
    "Experiment",
    "Fault",
    "FreezeRankFault",
    "JobProvider",
    "JobSection",
    "KillRankFault",
    "MethodActivity",
    "PauseActivity",
    "ProbeActivity",
    "PrometheusProvider",
    "Provider",
    "RevertActivity",
    "RollbackActivity",
    "SteadyStateHypothesis",
    "SteadyStateProbe",
    "Tolerance",
    "When",
    "expand",
    "placeholders_in",
]
