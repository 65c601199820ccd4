"""``trainer_fault``: arm a fault point of the trainer through its control file.

The agent adds one entry to ``<control-dir>/rank<R>.json``
(:mod:`stormwatch.faults.control_file`): ``slow_step`` (extra compute before
backward: a slow GPU or a dataloader stall), ``collective_delay`` (a slow link on
one rank), ``collective_hang`` (a rank that never joins a collective: FC-10),
``error_at_step`` (a crash raised by the training code). The entry carries
``expires_at`` (the TTL), so the trainer disarms it by itself; revert removes
exactly this entry and leaves other entries (another fault, a responder's
``checkpoint_now``) alone.

The control folder is the rank's own: its ``--control-dir``, else its
``STORMWATCH_CONTROL_DIR``, else ``<metrics-dir>/control`` (the trainer's precedence).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import Field

from stormwatch.faults.base import Fault, FaultRequest, Injection, Problem
from stormwatch.faults.control_file import ENTRY, arm, control_path, disarm, read_entries
from stormwatch.faults.errors import FaultError
from stormwatch.faults.kind import DetectClass, DetectClassBy, FaultKind, Placement, Target, Traits
from stormwatch.faults.limits import JobName, Rank
from stormwatch.faults.node import FaultContext
from stormwatch.faults.system import rank_option, rank_process
from stormwatch.faults.targeting import RankTarget

_TIMED = ("slow_step", "collective_delay")
_COLLECTIVE = ("collective_delay", "collective_hang")


def _seconds_of_point(fault: Any) -> Problem | None:
    needs_seconds = fault.point in _TIMED
    if needs_seconds and fault.seconds is None:
        return ("seconds", f"'seconds' is required for point {fault.point}: give the delay")
    if not needs_seconds and fault.seconds is not None:
        return ("seconds", f"'seconds' is not used by point {fault.point}: drop it")
    return None


def _step_of_point(fault: Any) -> Problem | None:
    if fault.point == "error_at_step" and fault.step is None:
        return ("step", "'step' is required for point error_at_step: give the step to fail at")
    if fault.point != "error_at_step" and fault.step is not None:
        return ("step", f"'step' is only for point error_at_step, not {fault.point}: drop it")
    return None


def _collective_filters(fault: Any) -> Problem | None:
    if fault.point not in _COLLECTIVE and (fault.op or fault.mesh_dim):
        return (
            "op" if fault.op else "mesh_dim",
            "'op' and 'mesh_dim' apply to collective_delay/collective_hang only: drop it",
        )
    return None


class TrainerFaultRequest(FaultRequest):
    """``trainer_fault``: ``rank``, ``job``, ``point`` and its fields (see the module doc)."""

    kind: Literal["trainer_fault"]
    rank: Rank
    job: JobName | None = None
    point: Literal["slow_step", "collective_delay", "collective_hang", "error_at_step"]
    seconds: float | None = Field(default=None, gt=0, le=3600)
    op: str | None = Field(default=None, min_length=1)
    mesh_dim: str | None = Field(default=None, min_length=1)
    step: int | None = Field(default=None, ge=1)

    checks = (_seconds_of_point, _step_of_point, _collective_filters)


class TrainerFault(Fault[TrainerFaultRequest]):
    """Add one entry to the rank's control file; revert removes exactly that entry."""

    def __init__(self, request: TrainerFaultRequest) -> None:
        super().__init__(request)
        self._path: Path | None = None

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.request
        process = rank_process(ctx, spec.rank, spec.job)
        control = rank_option(ctx, spec.job, "--control-dir")
        if control is None:  # the trainer's own precedence: option, environment, default
            with contextlib.suppress(psutil.Error):  # unreadable: the default below applies
                env = process.environ().get("STORMWATCH_CONTROL_DIR")
                control = Path(process.cwd(), env).resolve() if env else None
        if control is None:
            metrics = rank_option(ctx, spec.job, "--metrics-dir") or ctx.metrics_dir
            if metrics is None:
                raise FaultError(f"cannot tell rank {spec.rank}'s control folder on {ctx.node}")
            control = Path(metrics) / "control"
        self._path = control_path(control, spec.rank)

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.request
        assert self._path is not None
        fields = spec.model_dump(
            include={"point", "seconds", "op", "mesh_dim", "step"}, exclude_none=True
        )
        entry = ENTRY.validate_python(
            {**fields, "expires_at": round(time.time() + spec.ttl_seconds, 3)}
        )
        try:
            arm(self._path, entry)
        except OSError as exc:
            raise FaultError(f"trainer_fault: cannot write {self._path}: {exc}") from exc
        return Injection(
            details={"path": str(self._path), "entry": entry.model_dump(exclude_none=True)}
        )

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Remove this fault's entry (other entries stay); then :meth:`verify`.

        Raises:
            FaultError: the file cannot be rewritten.
        """
        if injection is None:
            return
        path, entry = (
            Path(injection.details["path"]),
            ENTRY.validate_python(injection.details["entry"]),
        )
        try:
            disarm(path, entry)
        except OSError as exc:
            raise FaultError(f"trainer_fault: cannot write {path}: {exc}") from exc
        self.verify(ctx, injection)

    def verify(self, ctx: FaultContext, injection: Injection | None) -> None:
        """This fault's entry is not in the control file.

        Raises:
            FaultError: it still is.
        """
        if injection is None:
            return
        path = Path(injection.details["path"])
        if ENTRY.validate_python(injection.details["entry"]) in read_entries(path):
            raise FaultError(f"trainer_fault entry still in {path}")


TRAINER_FAULT = FaultKind(
    kind="trainer_fault",
    summary=(
        "Arm one of the trainer's fault points on ``rank`` (its control file): ``slow_step`` "
        "(``seconds`` of extra compute per step), ``collective_delay`` (``seconds`` before each "
        "matching collective), ``collective_hang`` (blocks until the TTL), ``error_at_step``."
    ),
    traits=Traits(
        target=Target.RANK,
        placement=Placement.ONE_NODE,
        detect_class=DetectClassBy(
            "point",
            {
                "slow_step": DetectClass.SLOW_RANK,  # a compute straggler
                "collective_delay": DetectClass.SLOW_RANK,  # a slow link on one rank
                "collective_hang": DetectClass.HUNG_RANK,  # one rank never joins (FC-10)
                "error_at_step": DetectClass.RANK_KILLED,  # the training code raised: it exits
            },
        ),
        job_scoped=True,
    ),
    targeting=RankTarget,
    request=TrainerFaultRequest,
    fault=TrainerFault,
)

__all__ = ["TRAINER_FAULT", "TrainerFault", "TrainerFaultRequest"]
