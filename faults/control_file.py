"""The trainer's control file ``<control-dir>/rank<R>.json``: its model, read and written here.

Written by the agent (kind ``trainer_fault``), by the platform backends
(``checkpoint_now``) and by tests and people; read once per step by the trainer
(``stormwatch.trainer.control.ControlChannel``). Writers replace the file
atomically (a temporary file, then a rename)::

    {"faults": [
      {"point": "slow_step", "seconds": 0.5, "expires_at": 1767225600.0},
      {"point": "collective_delay", "seconds": 0.2, "op": "all_reduce", "mesh_dim": "tp",
       "expires_at": 1767225600.0},
      {"point": "collective_hang", "op": "all_gather", "expires_at": 1767225600.0},
      {"point": "error_at_step", "step": 12},
      {"point": "checkpoint_now", "requested_at": 1767225000.0},
      {"point": "kill_at_step", "step": 6, "attempt": 0},
      {"point": "checkpoint_kill", "phase": "before_marker", "step": 4, "attempt": 0},
      {"point": "freeze_at_step", "step": 1, "seconds": 8, "attempt": 0},
      {"point": "stage_hang", "stage": "mesh", "attempt": 0},
      {"point": "stage_kill", "stage": "parallelize", "attempt": 1},
      {"point": "stage_freeze", "stage": "checkpoint_load", "seconds": 8, "attempt": 2}
    ]}

Fault points (:data:`POINTS`):

* ``slow_step``: sleep ``seconds`` of extra compute in every step, before the
  backward pass (a compute straggler, FC-14).
* ``collective_delay``: sleep ``seconds`` before issuing every matching
  collective (``op`` and ``mesh_dim`` filter; omitted = any).
* ``collective_hang``: block before issuing the first matching collective until
  the fault expires (forever without ``expires_at``) or its entry is removed (a
  chaos revert): for the peers this rank never joins that collective (FC-10).
* ``error_at_step``: raise ``InjectedFault`` at the start of ``step``.
* ``checkpoint_now``: save a checkpoint at the end of the current step on every
  rank, unless one was started after ``requested_at`` (Unix time).
* ``kill_at_step``: SIGKILL the rank at the start of ``step`` (before its batch is
  drawn), so steps up to ``step - 1`` are complete: a crash to resume from.
* ``checkpoint_kill``: SIGKILL the rank at ``phase`` of the save of ``step``
  (``before_shards``: before this rank writes its shard files;
  ``before_metadata``: on rank 0, after every shard and before ``.metadata``;
  ``before_marker``: on rank 0, before the completion marker). In async mode the
  first two fire on the writer thread while training goes on.
* ``freeze_at_step``: SIGSTOP the rank at the start of ``step`` (before its first
  collective), SIGCONT after ``seconds`` (by a helper process; without ``seconds`` it
  stays stopped until killed): a rank that neither progresses, answers nor exits.
* ``stage_hang``, ``stage_kill``, ``stage_freeze``: at the start of the start-up stage
  ``stage`` (:data:`STAGES`: ``rendezvous``, before the process group exists; ``mesh``;
  ``parallelize``; ``checkpoint_load``), inside it (the stage is marked): block until
  the entry expires or is removed, SIGKILL, or SIGSTOP as ``freeze_at_step``. Read from
  the file once at each stage: write it before the job starts.

Every entry may carry ``expires_at`` (Unix time: disarmed from then on) and
``attempt`` (armed only in that attempt of the job: the job-wide restart count the ranks
agree at start-up, :mod:`stormwatch.telemetry.restarts`, so a node restarted only because
a peer failed counts it too; the node's ``TORCHELASTIC_RESTART_COUNT`` in the
``rendezvous`` stage, before the agreement: ``attempt: 0`` crashes once, then the
restarted workers resume). A file written
before the job starts is honoured from step 1 (and for the saves of step 1).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

log = logging.getLogger(__name__)

#: Phases of a save at which ``checkpoint_kill`` may fire, in the order a save passes them.
CHECKPOINT_PHASES = ("before_shards", "before_metadata", "before_marker")
#: Start-up stages at which ``stage_hang``/``stage_kill``/``stage_freeze`` may fire, in order:
#: :data:`stormwatch.telemetry.phases.STARTUP_STAGES` (not imported: telemetry reaches this
#: package through the shared contracts; a test checks they are the same).
STAGES = ("rendezvous", "mesh", "parallelize", "checkpoint_load")
Stage = Literal["rendezvous", "mesh", "parallelize", "checkpoint_load"]
#: Seconds a frozen rank stays stopped (``seconds`` of the freeze points): None = until killed.
FreezeSeconds = Annotated[float | None, Field(default=None, gt=0, le=3600)]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    expires_at: float | None = Field(default=None, description="Unix time; disarmed from then on")
    attempt: int | None = Field(
        default=None, ge=0, description="armed only in this torchrun attempt (None: every one)"
    )


class SlowStep(_Entry):
    point: Literal["slow_step"]
    seconds: float = Field(gt=0, le=3600)


class CollectiveDelay(_Entry):
    point: Literal["collective_delay"]
    seconds: float = Field(gt=0, le=3600)
    op: str | None = None
    mesh_dim: str | None = None


class CollectiveHang(_Entry):
    point: Literal["collective_hang"]
    op: str | None = None
    mesh_dim: str | None = None


class ErrorAtStep(_Entry):
    point: Literal["error_at_step"]
    step: int = Field(ge=1)


class CheckpointNow(_Entry):
    point: Literal["checkpoint_now"]
    requested_at: float


class KillAtStep(_Entry):
    point: Literal["kill_at_step"]
    step: int = Field(ge=1)


class CheckpointKill(_Entry):
    point: Literal["checkpoint_kill"]
    phase: Literal["before_shards", "before_metadata", "before_marker"]
    step: int = Field(ge=1)

    @model_validator(mode="before")
    @classmethod
    def _phase_and_step(cls, data: Any) -> Any:
        """One message naming every phase for any malformed phase or step."""
        if not isinstance(data, dict):
            return data
        phase, step = data.get("phase"), data.get("step")
        good_step = isinstance(step, int) and not isinstance(step, bool) and step >= 1
        if phase not in CHECKPOINT_PHASES or not good_step:
            raise ValueError(
                f"checkpoint_kill needs 'phase', one of {', '.join(CHECKPOINT_PHASES)}, and "
                f"'step' >= 1 (got phase={phase!r}, step={step!r})"
            )
        return data


class FreezeAtStep(_Entry):
    point: Literal["freeze_at_step"]
    step: int = Field(ge=1)
    seconds: FreezeSeconds = None


class StageHang(_Entry):
    point: Literal["stage_hang"]
    stage: Stage


class StageKill(_Entry):
    point: Literal["stage_kill"]
    stage: Stage


class StageFreeze(_Entry):
    point: Literal["stage_freeze"]
    stage: Stage
    seconds: FreezeSeconds = None


ControlEntry = Annotated[
    SlowStep
    | CollectiveDelay
    | CollectiveHang
    | ErrorAtStep
    | CheckpointNow
    | KillAtStep
    | CheckpointKill
    | FreezeAtStep
    | StageHang
    | StageKill
    | StageFreeze,
    Field(discriminator="point"),
]


class ControlFile(BaseModel):
    """The content of ``rank<R>.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    faults: tuple[ControlEntry, ...] = ()


#: Names of the fault points.
POINTS = (
    "slow_step",
    "collective_delay",
    "collective_hang",
    "error_at_step",
    "checkpoint_now",
    "kill_at_step",
    "checkpoint_kill",
    "freeze_at_step",
    "stage_hang",
    "stage_kill",
    "stage_freeze",
)

ENTRY: TypeAdapter[ControlEntry] = TypeAdapter(ControlEntry)


def control_path(control_dir: Path, rank: int) -> Path:
    """``<control_dir>/rank<rank>.json``."""
    return Path(control_dir) / f"rank{rank}.json"


def read_entries(path: Path) -> list[ControlEntry]:
    """The valid entries of a control file, for a writer that rewrites it.

    A missing file has none. An entry that does not validate is dropped (warning):
    the trainer ignores a whole file that does not parse, so rewriting without it
    re-arms the rest. A file that is not JSON of the documented shape is logged
    and counts as empty (the writer replaces it).
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("control file %s unreadable (%s); replacing it", path, exc)
        return []
    try:
        data = json.loads(raw)
    except ValueError as exc:
        log.warning("control file %s unreadable (%s); replacing it", path, exc)
        return []
    items = data.get("faults") if isinstance(data, dict) else None
    if not isinstance(items, list):
        log.warning("control file %s has no 'faults' list; replacing it", path)
        return []
    entries: list[ControlEntry] = []
    for item in items:
        try:
            entries.append(ENTRY.validate_python(item))
        except ValidationError as exc:
            log.warning("control file %s: dropping entry %r (%s)", path, item, _first(exc))
    return entries


def write_entries(path: Path, entries: list[ControlEntry]) -> None:
    """Replace ``path`` atomically with ``entries`` (remove it when there are none).

    Raises:
        OSError: the folder cannot be created or the file written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if not entries:
        path.unlink(missing_ok=True)
        return
    content = ControlFile(faults=tuple(entries)).model_dump_json(exclude_none=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(content, encoding="utf-8")
    os.replace(tmp, path)


def arm(path: Path, entry: ControlEntry, *, replacing: str | None = None) -> list[ControlEntry]:
    """Add ``entry`` to the file (once: an equal entry is not added again, and an unchanged
    file is not rewritten), keeping the other entries; ``replacing`` a point name drops the
    older entries of that point first.

    Returns:
        The entries written.

    Raises:
        OSError: as :func:`write_entries`.
    """
    current = read_entries(path)
    entries = [e for e in current if replacing is None or e.point != replacing]
    if entry not in entries:
        entries.append(entry)
    if entries != current:
        write_entries(path, entries)
    return entries


def disarm(path: Path, entry: ControlEntry) -> None:
    """Remove every entry equal to ``entry``; the other entries stay (idempotent).

    Raises:
        OSError: as :func:`write_entries`.
    """
    entries = read_entries(path)
    if entry in entries:
        write_entries(path, [e for e in entries if e != entry])


def _first(exc: ValidationError) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


__all__ = [
    "CHECKPOINT_PHASES",
    "ENTRY",
    "POINTS",
    "STAGES",
    "CheckpointKill",
    "CheckpointNow",
    "CollectiveDelay",
    "CollectiveHang",
    "ControlEntry",
    "ControlFile",
    "ErrorAtStep",
    "FreezeAtStep",
    "KillAtStep",
    "SlowStep",
    "StageFreeze",
    "StageHang",
    "StageKill",
    "arm",
    "control_path",
    "disarm",
    "read_entries",
    "write_entries",
]
