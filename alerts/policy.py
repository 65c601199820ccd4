"""The runbook policy: which actions the responder takes for which alert, and its guards.

A policy is a YAML file (``stormwatch alerts serve --policy FILE``), parsed once
at the edge into the frozen pydantic model :class:`Policy`; unknown keys are
rejected with the valid set, and every error names the file and the field::

    dry_run: false                 # true: remedial actions only record what they would do
    guards:
      restart_budget: {max_actions: 3, window: 1h}    # restarts per job (restart kinds)
      rate_limit: {max_actions: 10, window: 1m}       # remedial actions, all jobs
      circuit_breaker: {failures: 3, cooldown: 10m}   # per kind, consecutive failures
      max_concurrent: 2                               # remedial actions running at once
      approval_required: [exclude_node_restart]       # wait for `stormwatch alerts approve ID`
    rules:
      - alertname: StormwatchRankStalled
        actions: [confirm_restart]
      - alertname: StormwatchTrainingHung
        actions: [collect_diagnostics]

Without a file the responder uses :func:`default_policy`: ``StormwatchRankStalled``
-> ``confirm_restart`` only (torchrun restarts the workers itself; the lab's
kill-rank demo depends on exactly that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from stormwatch.durations import parse_duration
from stormwatch.errors import ConfigError
from stormwatch.yamltext import yaml_mapping

#: Every action kind a policy may name.
ActionKind = Literal[
    "confirm_restart",
    "restart_workers",
    "exclude_node_restart",
    "checkpoint_now",
    "collect_diagnostics",
    "notify_only",
]
#: Kinds that change the running job (guarded by budget, rate limit, breaker,
#: concurrency, dry-run and approval). The others only read or record.
REMEDIAL_KINDS: frozenset[str] = frozenset(
    {"restart_workers", "exclude_node_restart", "checkpoint_now"}
)
#: Kinds that restart workers (counted against the per-job restart budget).
RESTART_KINDS: frozenset[str] = frozenset({"restart_workers", "exclude_node_restart"})


def _seconds(value: object) -> object:
    if isinstance(value, str):
        return parse_duration(value, "duration")
    return value


Seconds = Annotated[float, BeforeValidator(_seconds), Field(gt=0)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Budget(_Model):
    """At most ``max_actions`` within ``window`` seconds (YAML: a duration such as ``1h``)."""

    max_actions: int = Field(ge=0)
    window: Seconds


class CircuitBreaker(_Model):
    """After ``failures`` consecutive failed actions of one kind, refuse that kind
    for ``cooldown`` seconds after the last failure."""

    failures: int = Field(default=3, ge=1)
    cooldown: Seconds = 600.0


class Guards(_Model):
    """Limits on remedial actions (:data:`REMEDIAL_KINDS`).

    Defaults: 3 restarts per job per hour (a job that needs more is crash-looping;
    StormwatchRestartStorm fires at 3 in 30 m), 10 remedial actions per minute
    overall, breaker after 3 consecutive failures for 10 m, 2 at once, no approvals.
    """

    restart_budget: Budget = Budget(max_actions=3, window=3600.0)
    rate_limit: Budget = Budget(max_actions=10, window=60.0)
    circuit_breaker: CircuitBreaker = CircuitBreaker()
    max_concurrent: int = Field(default=2, ge=1)
    approval_required: tuple[ActionKind, ...] = ()
    approval_timeout: Seconds = 3600.0


class Rule(_Model):
    """Alert name -> action kinds, run in order once per incident."""

    alertname: str = Field(min_length=1)
    actions: tuple[ActionKind, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Rule:
        if len(set(self.actions)) != len(self.actions):
            raise ValueError(f"actions of {self.alertname} repeat a kind: {list(self.actions)}")
        return self


class Policy(_Model):
    """A validated runbook policy (see the module docstring for the file format)."""

    dry_run: bool = False
    guards: Guards = Guards()
    rules: tuple[Rule, ...] = ()

    @model_validator(mode="after")
    def _one_rule_per_alert(self) -> Policy:
        names = [r.alertname for r in self.rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"rules: alertname {dupes} appears more than once; merge them")
        return self

    def kinds_for(self, alertname: str) -> tuple[str, ...]:
        """The action kinds for ``alertname`` (empty: notify only)."""
        for rule in self.rules:
            if rule.alertname == alertname:
                return tuple(rule.actions)
        return ()

    def kinds(self) -> frozenset[str]:
        """Every kind some rule uses."""
        return frozenset(k for r in self.rules for k in r.actions)


def default_policy() -> Policy:
    """The shipped policy: ``StormwatchRankStalled`` -> ``confirm_restart`` only."""
    return Policy(rules=(Rule(alertname="StormwatchRankStalled", actions=("confirm_restart",)),))


def _valid_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Field names of the model at ``loc`` (for "unknown key" errors)."""
    current: type[BaseModel] = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        info = current.model_fields.get(str(part))
        if info is None:
            return []
        annotation = info.annotation
        inner = getattr(annotation, "__args__", (annotation,))
        found = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if found is None:
            return []
        current = found
    return sorted(current.model_fields)


def parse_policy(text: str, *, origin: str = "<policy>") -> Policy:
    """Validate policy YAML text.

    Raises:
        ConfigError: not YAML, not a mapping, empty, or invalid; the message names
            ``origin``, the field path and the fix (the valid keys for an unknown one).
    """
    data = yaml_mapping(
        text, origin, not_mapping="must be a mapping with keys dry_run, guards, rules"
    )
    if not data:  # read as no rules, it would turn every remediation off without a word
        raise ConfigError(
            f"{origin}: empty; a policy names its rules (`rules:` with an alertname and its "
            "actions each); write `rules: []` for a responder that runs no action"
        )
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        messages = []
        for error in exc.errors(include_url=False):
            loc = tuple(error["loc"])
            field = ".".join(str(p) for p in loc) or "(top level)"
            if error["type"] == "extra_forbidden":
                valid = ", ".join(_valid_keys(Policy, loc))
                messages.append(f"{field}: unknown key; valid keys: {valid}")
            else:
                messages.append(f"{field}: {error['msg']}")
        raise ConfigError(f"{origin}: " + "; ".join(messages)) from exc
    except ConfigError as exc:  # a bad duration, raised inside a validator
        raise ConfigError(f"{origin}: {exc}") from exc


def load_policy(path: Path, *, field: str = "policy file") -> Policy:
    """Read and validate a policy file.

    ``field`` is how the caller's user gave the path (``--policy`` for an option,
    ``POLICY_FILE`` for a positional argument); errors reading the file start with it.

    Raises:
        ConfigError: unreadable or invalid (see :func:`parse_policy`).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"{field}: cannot read {path}: {exc.strerror or exc}; "
            "give the path of a runbook policy YAML file"
        ) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{field}: {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8 YAML"
        ) from exc
    return parse_policy(text, origin=str(path))


__all__ = [
    "REMEDIAL_KINDS",
    "RESTART_KINDS",
    "ActionKind",
    "Budget",
    "CircuitBreaker",
    "Guards",
    "Policy",
    "Rule",
    "default_policy",
    "load_policy",
    "parse_policy",
]
