"""Phases that legitimately pause training progress, and how long each may.

A job marks such a phase with :func:`stormwatch.telemetry.phase`; while inside, the
rank exports ``stormwatch_train_phase_deadline_timestamp_seconds{phase}`` = the Unix
time it entered + the phase's bound. The agent's hang detector and the Prometheus
rules do not call a rank hung while that deadline is in the future; past it, the rank
is judged by its progress heartbeat again (docs/ARCHITECTURE.md "Trainer -> agent
telemetry"). The bound is decided here, on the job's side, so the agent and the rules
need no per-phase setting.

The start-up stages (:data:`STARTUP_STAGES`) are phases too: a job marks each of
them, in this order, before its first step, so a rank has a heartbeat (set at every
phase boundary) before its process group exists, and a rank stuck in one is named by
the stage it is stuck in (the ``phase`` label, the agent's ``rank_hang`` event, the
post-mortem):

* ``rendezvous``: ``torch.distributed.init_process_group`` (every rank of the job
  must reach it; ``stormwatch.telemetry`` marks it by itself when it counts
  collectives);
* ``mesh``: the device mesh and its process groups;
* ``parallelize``: building, sharding and wrapping the model (TP, FSDP, pipeline);
* ``checkpoint_load``: resuming from the latest checkpoint.

Default bounds (seconds) and why:

* ``rendezvous`` 600: the workers' group waits for the slowest process to start
  (imports, CUDA initialisation); torchrun has gathered the nodes already. 10
  minutes is torchrun's own rendezvous ``join_timeout`` default.
* ``mesh`` 300: a mesh's sub-groups are made through the store, one round per
  group: seconds even at thousands of ranks (NCCL communicators are made lazily,
  at the first collective, not here).
* ``parallelize`` 600: materialising and sharding a 70B-parameter model takes a
  few minutes; 10 leaves room.
* ``checkpoint_save`` 900, ``checkpoint_load`` 900: a 70B-parameter job's ~1 TB of
  model and optimizer state at ~2 GB/s per node to a parallel file system is several
  minutes; 15 minutes leaves room, and is still shorter than a person's first look.
* ``eval`` 1800: an evaluation pass of a few thousand batches at training speed.
* ``data_wait`` 300: a data loader that has not produced a batch in 5 minutes is
  stuck, not slow (a shard reopen on object storage takes seconds).
* ``stopping`` 120: entered by :mod:`stormwatch.telemetry` itself when the rank gets
  SIGTERM (a scheduler's cancel, requeue or preemption, torchrun stopping its workers for
  a restart or an elastic resize): the rank may flush, dump and save before it ends.
  Slurm's ``KillWait`` and Kubernetes' ``terminationGracePeriodSeconds`` both default to
  30 s, after which SIGKILL comes; 120 s leaves room for a preemption checkpoint. The
  agent counts the rank's exit as a stop, not a failure (``<metrics-dir>/rank<R>.stopping``,
  :func:`stormwatch.telemetry.rank.stop_marker_path`).

``STORMWATCH_PHASE_BOUNDS`` overrides them per job, e.g. ``eval=7200,data_wait=60``
(read by :func:`stormwatch.telemetry.init`). No torch import here (the agent imports it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseSpec:
    """One phase a job may mark.

    Attributes:
        name: the ``phase`` label value.
        bound_seconds: how long the phase may pause progress before it is a hang.
        in_step: time spent in it counts towards the step it falls in (``data_wait``:
            fetching a batch is part of a step; a checkpoint or an eval pass is not).
    """

    name: str
    bound_seconds: float
    in_step: bool


#: The phases, by name (the ``phase`` label values).
PHASES: Mapping[str, PhaseSpec] = {
    spec.name: spec
    for spec in (
        PhaseSpec("rendezvous", 600.0, in_step=False),
        PhaseSpec("mesh", 300.0, in_step=False),
        PhaseSpec("parallelize", 600.0, in_step=False),
        PhaseSpec("checkpoint_save", 900.0, in_step=False),
        PhaseSpec("checkpoint_load", 900.0, in_step=False),
        PhaseSpec("eval", 1800.0, in_step=False),
        PhaseSpec("data_wait", 300.0, in_step=True),
        PhaseSpec("stopping", 120.0, in_step=False),
    )
}

#: The start-up stages, in the order a job passes them before its first step.
STARTUP_STAGES = ("rendezvous", "mesh", "parallelize", "checkpoint_load")

#: Environment variable holding per-phase bound overrides (``name=seconds,...``).
PHASE_BOUNDS_ENV = "STORMWATCH_PHASE_BOUNDS"


def parse_bounds(text: str) -> tuple[dict[str, float], list[str]]:
    """``"eval=7200,data_wait=60"`` -> ({phase: seconds}, problems).

    Each problem is one message naming the entry and the fix; bad entries are left out
    (the default bound of that phase applies).
    """
    bounds: dict[str, float] = {}
    problems: list[str] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, value = entry.partition("=")
        name = name.strip()
        if name not in PHASES or not sep:
            problems.append(
                f"{PHASE_BOUNDS_ENV}: {entry!r} is not <phase>=<seconds> with a phase of "
                f"{', '.join(PHASES)}"
            )
            continue
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds > 0 or seconds == float("inf"):
            problems.append(
                f"{PHASE_BOUNDS_ENV}: {entry!r}: the bound must be a positive number of seconds"
            )
            continue
        bounds[name] = seconds
    return bounds, problems


__all__ = ["PHASES", "PHASE_BOUNDS_ENV", "STARTUP_STAGES", "PhaseSpec", "parse_bounds"]
