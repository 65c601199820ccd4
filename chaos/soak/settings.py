"""What a soak runs and when (:class:`SoakSettings`), validated at construction.

A soak of ``minutes`` (T) trains one elastic job of the reference trainer and, in this order:

* at T/3 (``restart_at``), once the job has a checkpoint: a planned restart;
* at 2T/3 (``resize_at``), once the job has checkpointed since its resume: one node leaves,
  and ``rejoin_after_seconds`` (default T/12) after the job has shrunk it comes back;
* at T, once the job has grown back: the end (the job is stopped).

Checkpoints come every ``checkpoint_every`` steps and evaluation pauses of about
``eval_seconds`` every ``eval_every`` steps throughout. Each stage waits for the one before
it (the job's start, a resume, a shrink, a regrowth) at most ``wait_seconds``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stormwatch.errors import ConfigError

#: Evaluation micro-batches per data-parallel rank per pause; the pause's length comes from
#: the sleep after each (``--eval-delay`` = ``eval_seconds / EVAL_BATCHES``).
EVAL_BATCHES = 4


class SoakSettings(BaseModel):
    """A soak's plan. Seconds unless said otherwise.

    Attributes:
        minutes: the soak's planned length T (30 by default: several checkpoint and
            evaluation cycles, one restart and one resize, at a step every ~0.7 s).
        step_delay: the trainer's ``--step-delay``: 0.5 s keeps the lab's 2-core machine
            from spending the soak training (a step of the default model takes 0.1-0.3 s).
        checkpoint_every: the trainer's ``--checkpoint-every``.
        eval_every: the trainer's ``--eval-every`` (0: no evaluation pauses).
        eval_seconds: how long each evaluation pauses training: 45 s by default, far past the
            stall threshold (max(5 s, 3 x median step), alerts/rules/ranks.yml), so a
            pause that the ``eval`` phase did not excuse would be seen.
        restart_at / resize_at: when the planned restart and the resize start, as fractions
            of T.
        rejoin_after_seconds: how long the job runs shrunk before the node rejoins
            (``None``: T/12).
        settle_seconds: how long alerts are still counted after the job's end (the rules'
            ``for`` and windows: an alert caused by the end fires within it).
        leave_node: the node that leaves and rejoins (``None``: the job's last node; never
            the first, which hosts the rendezvous).
        seed: the trainer's ``--seed``.
        wait_seconds: the longest each stage may take (a start or restart of the workers:
            torch imports, rendezvous, resume) before the soak gives up on it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    minutes: float = Field(default=30.0, gt=0, le=7 * 24 * 60, allow_inf_nan=False)
    step_delay: float = Field(default=0.5, ge=0, le=60, allow_inf_nan=False)
    checkpoint_every: int = Field(default=20, ge=1)
    eval_every: int = Field(default=200, ge=0)
    eval_seconds: float = Field(default=45.0, gt=0, le=1800, allow_inf_nan=False)
    restart_at: float = Field(default=1 / 3, gt=0, lt=1)
    resize_at: float = Field(default=2 / 3, gt=0, lt=1)
    rejoin_after_seconds: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    settle_seconds: float = Field(default=60.0, ge=0, le=3600, allow_inf_nan=False)
    leave_node: str | None = None
    seed: int = Field(default=0, ge=0, lt=2**63)
    wait_seconds: float = Field(default=300.0, gt=0, le=3600, allow_inf_nan=False)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: "
                + str(err["msg"]).removeprefix("Value error, ")
                + (f" (got {err['input']!r})" if err.get("type") != "missing" else "")
                for err in exc.errors()
            )
            raise ConfigError(f"soak settings: {problems}") from exc

    @model_validator(mode="after")
    def _in_order(self) -> SoakSettings:
        if self.restart_at >= self.resize_at:
            raise ValueError(
                f"restart_at ({self.restart_at:g}) must come before resize_at "
                f"({self.resize_at:g}), both fractions of the soak"
            )
        return self

    @property
    def seconds(self) -> float:
        """T in seconds."""
        return self.minutes * 60.0

    @property
    def rejoin_after(self) -> float:
        """Seconds the job runs shrunk before the node rejoins."""
        if self.rejoin_after_seconds is not None:
            return self.rejoin_after_seconds
        return self.seconds / 12

    @property
    def eval_delay(self) -> float:
        """The trainer's ``--eval-delay``: the pause spread over :data:`EVAL_BATCHES` batches."""
        return self.eval_seconds / EVAL_BATCHES

    def trainer_args(self) -> tuple[str, ...]:
        """Options of ``stormwatch train`` beyond what the lab's job spec sets (evaluation)."""
        if self.eval_every == 0:
            return ()
        return (
            "--eval-every",
            str(self.eval_every),
            "--eval-batches",
            str(EVAL_BATCHES),
            "--eval-delay",
            f"{self.eval_delay:g}",
        )


__all__ = ["EVAL_BATCHES", "SoakSettings"]
