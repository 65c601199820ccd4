"""The experiment model: steady-state hypothesis, method, rollbacks (chaostoolkit's shape).

An experiment file (YAML, ``version: 1``) is parsed once, at the edge, by
:func:`stormwatch.chaos.experiment.loader.load_experiment` into these frozen, strict
pydantic models (``extra="forbid"``: unknown keys are errors, and no type
coercion: ``rank: "1"`` is rejected). Example: ``experiments/kill-rank.yaml``.

Shape::

    version: 1
    title, description, tags
    job:                      what to train (the runner starts it, or attaches with --job)
    steady_state_hypothesis:  title + probes, checked before and after the method
    method:                   actions (a typed fault, a ``target`` selector, ``when.step``,
                              ``background``), probes, ``until`` PromQL waits, pauses
    rollbacks:                revert / probe / pause activities
    rollback_strategy:        always (default) | default | deviated | never  (chaostoolkit's
                              meanings: every time; unless the hypothesis failed before the
                              method or the run was interrupted; only when the hypothesis did
                              not hold after; never). Whatever the strategy, every fault of
                              the experiment still open at the end is reverted.
    safeguards:               probes checked continuously during the method; one that fails
                              stops injecting, fails the run and rolls back
    blast_radius:             max_fraction_of_ranks (0.5): the most ranks all faults may touch
    expect:                   what a game day expects (alerts, category, loss check)

Probe providers: ``prometheus`` (PromQL vs tolerance), ``job`` (progressing/finished),
``http`` (status and body), ``ranks`` (ranks alive per the agents), ``progress`` (steps
per window), ``loss`` (finite, bounded, not diverging).

Probe queries may use the placeholders ``${job}``, ``${steps}``,
``${checkpoint_every}``, ``${world_size}`` and ``${since_start}``; the runner fills them in.
``${since_start}`` is the time since this run started, as a PromQL duration in whole
seconds (``95s``), taken at each evaluation: a window ``[${since_start}]`` sees nothing of an
earlier experiment (a fixed ``[2m]`` in a suite reaches into the one before).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stormwatch.chaos.experiment.providers import (
    HttpProvider,
    JobProvider,
    LossProvider,
    ProgressProvider,
    PrometheusProvider,
    Provider,
    RanksProvider,
    Tolerance,
)
from stormwatch.faults import REGISTRY, AnyExperimentFault
from stormwatch.faults.limits import NodeName, Rank

#: Placeholders a probe query may use (filled in by the runner at run time).
PLACEHOLDERS = ("job", "steps", "checkpoint_every", "world_size", "since_start")
#: Placeholders a ``job.command`` may use (filled in from the job section when it starts).
COMMAND_PLACEHOLDERS = ("job", "steps", "checkpoint_every", "seed", "step_delay")
_PLACEHOLDER_RE = re.compile(r"\$\{([^}]*)\}")
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
#: The experiment file format this stormwatch reads (the file's ``version:``).
EXPERIMENT_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


_Name = Annotated[
    str,
    Field(
        pattern=_NAME_PATTERN,
        description="letters, digits, '_', '.', '-'; starts with a letter or digit; <= 64 chars",
    ),
]


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


# The fault catalogue (one model per kind) is stormwatch.faults (AnyExperimentFault).


class When(_Model):
    """Hold an action until the job has completed ``step`` (rank logs), at most ``timeout_seconds``."""

    step: int = Field(ge=1)
    timeout_seconds: float = Field(default=600.0, gt=0, le=86_400)


class RandomPick(_Model):
    """Pick ``k`` targets, or ``percent`` of them (rounded up, at least one), with ``seed``.

    The same seed and pool give the same pick (``random.Random(seed).sample``).
    """

    k: int | None = Field(default=None, ge=1, le=65_536)
    percent: float | None = Field(default=None, gt=0, le=100)
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _one_size(self) -> RandomPick:
        if (self.k is None) == (self.percent is None):
            raise ValueError("give exactly one of 'k' (a count) or 'percent' (of the pool)")
        return self


#: Roles a target selector understands: ``leader`` rank 0, ``rdzv_host`` the ranks of the
#: node hosting the rendezvous store (the first node), ``worker`` every rank but 0, ``any``.
ROLES = ("leader", "rdzv_host", "worker", "any")


class TargetSelector(_Model):
    """Which ranks an action hits: exactly one of ``node``, ``ranks``, ``role``; ``random``
    then picks among them (alone: among every rank).

    For a rank fault (``kill_rank``, ``trainer_fault``, ...) one fault is injected per
    selected rank; for a node fault (``gpu_xid``, ``bandwidth_limit``, ...) one per node
    holding a selected rank. The fault itself then names no ``rank``/``node``.
    """

    node: NodeName | None = None
    ranks: list[Rank] | None = Field(default=None, min_length=1)
    role: Literal["leader", "rdzv_host", "worker", "any"] | None = None
    random: RandomPick | None = None

    @model_validator(mode="after")
    def _one_pool(self) -> TargetSelector:
        given = [n for n in ("node", "ranks", "role") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of node, ranks, role (got {', '.join(given)})")
        if not given and self.random is None:
            raise ValueError("give one of node, ranks, role, or random")
        return self


#: Fault kinds whose place is fixed by the fault itself, so an action may not give a ``target``
#: (their :attr:`~stormwatch.faults.Traits.fixed_place` says why).
_NO_TARGET = {
    name: d.traits.fixed_place for name, d in REGISTRY.items() if d.traits.fixed_place is not None
}


class ActionActivity(_Model):
    """Inject ``fault`` (when the job reaches ``when.step``, or at once).

    ``target`` selects the ranks/nodes instead of the fault's own ``rank``/``node``.
    ``background: true`` runs the action (its wait and injection) while the method
    goes on; the method waits for it at its end.
    """

    type: Literal["action"]
    name: _Name
    fault: AnyExperimentFault
    target: TargetSelector | None = None
    background: bool = False

    @model_validator(mode="before")
    @classmethod
    def _target_fills_the_fault(cls, data: object) -> object:
        """With ``target``, the fault names no rank/node: rank 0 stands in until the run
        (where the selection replaces it); validation of the rest of the fault still runs."""
        if not isinstance(data, dict) or data.get("target") is None:
            return data
        fault = data.get("fault")
        if not isinstance(fault, dict):
            return data
        kind = fault.get("kind")
        if isinstance(kind, str) and kind in _NO_TARGET:
            raise ValueError(
                f"fault kind {kind!r} takes no 'target' ({_NO_TARGET[kind]}); remove 'target'"
            )
        named = [k for k in ("rank", "node", "nodes") if k in fault]
        if named:
            raise ValueError(
                f"give the target either in 'target' or as the fault's {'/'.join(named)}, not both"
            )
        return {**data, "fault": {**fault, "rank": 0}}

    when: When | None = None
    pause_after_seconds: float = Field(default=0.0, ge=0, le=3600)


class ProbeActivity(_Model):
    """Wait until a condition holds, at most ``timeout_seconds`` (fails otherwise)."""

    type: Literal["probe"]
    name: _Name
    provider: Provider
    timeout_seconds: float = Field(default=60.0, ge=0, le=86_400)
    poll_seconds: float = Field(default=1.0, gt=0, le=60)


class UntilActivity(_Model):
    """Wait until a PromQL instant query is within ``tolerance``; fails after ``timeout_seconds``."""

    type: Literal["until"]
    name: _Name
    query: str = Field(min_length=1, description="PromQL; may use ${job}, ${steps}, ...")
    tolerance: Tolerance
    timeout_seconds: float = Field(default=60.0, gt=0, le=86_400)
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
    ActionActivity | ProbeActivity | PauseActivity | UntilActivity, Field(discriminator="type")
]
RollbackActivity = Annotated[
    RevertActivity | ProbeActivity | PauseActivity, Field(discriminator="type")
]
#: When rollbacks run (chaostoolkit's runtime strategies; see the module docstring).
RollbackStrategy = Literal["always", "default", "deviated", "never"]


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

    ``min_nodes`` makes the job elastic (torchrun ``--nnodes MIN:NODES``, the trainer's
    dp follows the nodes present): a lost node shrinks it, the survivors resume from
    the last checkpoint. ``global_batch`` (sequences per optimizer step) keeps the
    optimisation the same at any size; see :class:`stormwatch.lab.JobSpec`.
    Probes of an elastic job expect the ranks of its latest rendezvous.

    ``command`` runs the job's own training program instead of the reference trainer
    (``stormwatch train``): an executable and its arguments, started by torchrun on
    every node as the trainer would be (on the lab, through Slurm's recipe on a Slurm
    lab; on a Slurm target with ``job.submit``, as the template's ``STORMWATCH_COMMAND``).
    Its arguments may use ``${job}``, ``${steps}``, ``${checkpoint_every}``, ``${seed}``
    and ``${step_delay}`` (this section's values; ``${job}`` is the run's job name), and
    it finds its folders in its environment (``STORMWATCH_LOG_DIR``,
    ``STORMWATCH_DUMP_DIR``, ``STORMWATCH_CHECKPOINT_DIR``: see
    :class:`stormwatch.lab.JobSpec`). The probes, faults and post-mortem expect what the
    trainer writes, so the program reports through :mod:`stormwatch.telemetry` (or
    ``stormwatch run``). Not with ``min_nodes`` or ``global_batch`` (the trainer's).
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
    min_nodes: int | None = Field(default=None, ge=1, le=64)
    global_batch: int | None = Field(default=None, ge=1, le=1_048_576)
    command: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, min_length=1, description="the job's own training program and arguments"
    )

    @field_validator("command")
    @classmethod
    def _known_placeholders(cls, value: list[str] | None) -> list[str] | None:
        unknown = sorted(
            {n for word in value or () for n in placeholders_in(word)} - set(COMMAND_PLACEHOLDERS)
        )
        if unknown:
            allowed = ", ".join("${" + p + "}" for p in COMMAND_PLACEHOLDERS)
            raise ValueError(f"unknown placeholder(s) {unknown} (allowed: {allowed})")
        return value

    @model_validator(mode="after")
    def _command_is_not_the_trainer(self) -> JobSection:
        if self.command is not None:
            for name in ("min_nodes", "global_batch"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} shapes the reference trainer (stormwatch train); a job.command "
                        f"runs its own program: remove {name} or pass it in the command"
                    )
        return self

    def command_line(self) -> list[str] | None:
        """:attr:`command` with its placeholders filled in from this section (``None``:
        the job runs the reference trainer)."""
        if self.command is None:
            return None
        values = {
            "job": self.name,
            "steps": str(self.steps),
            "checkpoint_every": str(self.checkpoint_every),
            "seed": str(self.seed),
            "step_delay": repr(self.step_delay),
        }
        return [expand(word, values) for word in self.command]

    @model_validator(mode="after")
    def _min_nodes_fit(self) -> JobSection:
        if self.min_nodes is not None and self.nodes is not None and self.min_nodes > self.nodes:
            raise ValueError(
                f"min_nodes ({self.min_nodes}) is more than nodes ({self.nodes}): an elastic job "
                "runs on MIN_NODES..NODES nodes; lower min_nodes or raise nodes"
            )
        return self

    @property
    def fixed_world_size(self) -> int | None:
        """``world_size``, else ``nodes`` * ``nproc_per_node``; ``None`` when not fixed."""
        if self.world_size is not None:
            return self.world_size
        if self.nodes is not None and self.nproc_per_node is not None:
            return self.nodes * self.nproc_per_node
        return None


class Expectations(_Model):
    """What a game day expects of the experiment; the scorecard's verdict uses it.

    Attributes:
        detect: an alert about the job must fire after the fault (False: the fault is
            expected to go unnoticed, e.g. a slowdown below the straggler threshold).
        alerts: alert names that count as detection (empty: any alert about the job).
        category: the failure category in the planner's table (``plan/llama3_table5.yaml``
            ids, e.g. ``faulty_gpu``) whose detect/recover times this experiment measures
            for ``stormwatch plan``; default from the fault kind
            (:attr:`stormwatch.faults.Traits.category`).
        loss: after recovery the loss must be ``identical`` (bitwise) to a fault-free
            baseline, ``bounded`` (relative difference <= ``loss_rel_tolerance``: elastic
            resizes), or is not compared (``skip``).
        loss_rel_tolerance: the bound for ``bounded`` (default 0.05,
            :data:`stormwatch.chaos.reports.verify.ELASTIC_LOSS_REL_BOUND`).
        strict_targets: the detection targets count toward the verdict: detected within
            the fault's class target, by an alert naming the fault, and no false alarm
            (:mod:`stormwatch.chaos.gameday.targets`, docs/chaos-suite.md). Off by default:
            the alert rules are being made faster (issue 18), and until they are a game
            day reports the targets without failing on them; ``stormwatch chaos suite
            --strict-targets`` turns it on for every experiment of a suite.
    """

    detect: bool = True
    alerts: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list
    )
    category: str | None = Field(default=None, pattern=r"^[a-z0-9_]+$")
    loss: Literal["identical", "bounded", "skip"] = "identical"
    loss_rel_tolerance: float = Field(default=0.05, ge=0, le=1)
    strict_targets: bool = False


class BlastRadius(_Model):
    """The most an experiment may touch: at most ``max_fraction_of_ranks`` of the job's ranks
    over all its faults (a node fault touches every rank of its node), and never fewer than
    one rank. Checked when the file is validated (when the job's shape is fixed) and again,
    on the real job, before anything is injected."""

    max_fraction_of_ranks: float = Field(default=0.5, gt=0, le=1)


class Safeguard(_Model):
    """A condition checked every ``interval_seconds`` from the method's start to the end of the
    after-phase; when it does not hold, the run stops injecting, is marked failed and rolls back.
    """

    name: _Name
    provider: Provider
    interval_seconds: float = Field(default=2.0, gt=0, le=600)


class Experiment(_Model):
    """A chaos experiment (see the module docstring for the file shape)."""

    # The default only lets _version word a missing version itself (pydantic's own says
    # "required field missing (one of 1)"); None is always refused, so the field is required.
    version: Literal[1] = Field(default=None, validate_default=True)
    title: str = Field(min_length=1)
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    job: JobSection
    steady_state_hypothesis: SteadyStateHypothesis
    method: list[MethodActivity] = Field(min_length=1)
    rollbacks: list[RollbackActivity] = Field(default_factory=list)
    rollback_strategy: RollbackStrategy = "always"
    expect: Expectations = Field(default_factory=Expectations)
    blast_radius: BlastRadius = Field(default_factory=BlastRadius)
    safeguards: list[Safeguard] = Field(default_factory=list)

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        """Refuse any version but :data:`EXPERIMENT_VERSION` in plain words, with the fix."""
        expected = EXPERIMENT_VERSION
        if type(value) is int and value == expected:
            return value
        if value is None:
            raise ValueError(
                f"missing; this stormwatch reads version {expected}: add `version: {expected}`"
            )
        if type(value) is int:  # a later version's file, or a version that never was
            later = f", or use a stormwatch that reads version {value}" if value > expected else ""
            raise ValueError(
                f"this stormwatch reads version {expected} only, not {value}: write the file "
                f"for version {expected} (`version: {expected}`){later}"
            )
        raise ValueError(
            f"must be the number {expected} (got {value!r}): write `version: {expected}`"
        )


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
    "COMMAND_PLACEHOLDERS",
    "PLACEHOLDERS",
    "ROLES",
    "ActionActivity",
    "BlastRadius",
    "Expectations",
    "Experiment",
    "HttpProvider",
    "JobProvider",
    "JobSection",
    "LossProvider",
    "MethodActivity",
    "PauseActivity",
    "ProbeActivity",
    "ProgressProvider",
    "PrometheusProvider",
    "Provider",
    "RandomPick",
    "RanksProvider",
    "RevertActivity",
    "RollbackActivity",
    "RollbackStrategy",
    "Safeguard",
    "SteadyStateHypothesis",
    "SteadyStateProbe",
    "TargetSelector",
    "Tolerance",
    "UntilActivity",
    "When",
    "expand",
    "placeholders_in",
]
