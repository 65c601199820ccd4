"""A rank's start-up: its stages, the timeline of their ends, and the start announcement.

A restarted rank spends seconds between its process start and its first step (torch
import, rendezvous, mesh, model, checkpoint load); :class:`StartupTimeline` records
when each part ended, so the rank can say where its start-up went. The parts, in order
(each one's seconds run from the end of the one before; the first from the process
start, ``psutil.Process().create_time()``, 10 ms resolution on Linux):

* ``cli``: interpreter, the ``stormwatch`` command and the options' validation
  (:mod:`stormwatch.trainer.cli`; no torch yet);
* ``imports``: the training loop's imports (torch, torch.distributed, DTensor, DCP);
* ``telemetry``: the rank's telemetry session (metrics, event log, spans);
* ``rendezvous``: the default process group (and the job attempt agreed over it);
* ``mesh``: the device mesh and its sub-groups;
* ``data``: the corpus and batch sampler;
* ``parallelize``: the model built, parallelized (TP, FSDP2), its optimizer;
* ``checkpoint_load``: the checkpointer and the resume from the latest checkpoint.

The four stages named in :data:`STAGES` are also telemetry phases (:class:`StartupStages`):
the rank has a heartbeat and a deadline in each, and a hang or dump names the stage.
The rank logs the timeline once it is ready to train (INFO, ``stormwatch -v``; with
``--log-format json`` the record carries ``startup_seconds`` and ``startup_cpu_seconds``,
part name to wall and CPU seconds, and ``process_start``, Unix seconds), and rank 0's
progress line gives the total.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from stormwatch.trainer.errors import ControlFileError

if TYPE_CHECKING:  # the CLI imports this module before torch and telemetry
    import stormwatch.telemetry as swt
    from stormwatch.trainer.checkpoint.checkpointer import Checkpointer
    from stormwatch.trainer.config import TrainConfig
    from stormwatch.trainer.control import ControlChannel
    from stormwatch.trainer.data.batches import BatchSampler
    from stormwatch.trainer.parallel.dims import ParallelDims
    from stormwatch.trainer.progress import ConsoleProgress
    from stormwatch.trainer.runtime import RankEnv

log = logging.getLogger(__name__)

#: The start-up stages that are telemetry phases (with fault points ``stage_<name>``).
STAGES = ("rendezvous", "mesh", "parallelize", "checkpoint_load")


@dataclass
class StartupTimeline:
    """When each part of this process's start-up ended.

    Attributes:
        process_start: the process's start, Unix seconds.
        marks: ``(part, end, cpu)`` in order: ``end`` in Unix seconds, ``cpu`` the
            process's CPU seconds then (all threads, ``time.process_time()``), which
            tells a part that computes from one that waits (for peers, or for a core).
    """

    process_start: float
    marks: list[tuple[str, float, float]] = field(default_factory=list)

    @classmethod
    def of_this_process(cls) -> StartupTimeline:
        """A timeline from this process's start (psutil; the kernel's start time)."""
        return cls(process_start=psutil.Process().create_time())

    def mark(self, part: str) -> None:
        """``part`` ended now (``time.time()``)."""
        self.marks.append((part, time.time(), time.process_time()))

    def seconds(self) -> dict[str, float]:
        """Wall seconds of each part, from the end of the one before (the first: from the
        process start), in order; a part marked twice adds up."""
        return self._parts(self.process_start, 1)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds of each part (the first: from the process start), as :meth:`seconds`."""
        return self._parts(0.0, 2)

    def _parts(self, origin: float, column: int) -> dict[str, float]:
        out: dict[str, float] = {}
        previous = origin
        for mark in self.marks:
            value = float(mark[column])
            out[mark[0]] = out.get(mark[0], 0.0) + max(0.0, value - previous)
            previous = value
        return out

    def total(self) -> float:
        """Seconds from the process start to the last mark (0 without marks)."""
        return max(0.0, self.marks[-1][1] - self.process_start) if self.marks else 0.0

    def describe(self) -> str:
        """``"cli 0.41 s (CPU 0.30 s), imports 3.02 s (CPU 2.50 s), ..."``: for a log line."""
        cpu = self.cpu_seconds()
        return ", ".join(
            f"{part} {seconds:.2f} s (CPU {cpu[part]:.2f} s)"
            for part, seconds in self.seconds().items()
        )


@dataclass
class StartupStages:
    """The start-up stages of one rank: telemetry phases, fault points, timeline marks.

    Attributes:
        session: the rank's telemetry session (phases, fault records).
        control: the control file's fault points (``stage_*`` fire inside their stage).
        timeline: marked at the end of every stage.
    """

    session: swt.Session
    control: ControlChannel
    timeline: StartupTimeline

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Start-up stage ``name`` (one of :data:`STAGES`): a telemetry phase, so the rank
        has a heartbeat and a deadline before its first step and a hang or dump names the
        stage; its fault points (``stage_*``) fire inside it, first; its end is marked."""
        with self.session.phase(name):
            # step 0: before any step
            self.control.on_fire = functools.partial(_fired, self.session, 0)
            try:
                self.control.stage(name)
            except ControlFileError as exc:  # a bad file arms nothing; training goes on
                self.session.report_error("control", exc)
            yield
        self.timeline.mark(name)

    def announce(
        self,
        config: TrainConfig,
        env: RankEnv,
        dims: ParallelDims,
        progress: ConsoleProgress | None,
        *,
        resumed: int | None,
        checkpointer: Checkpointer,
        sampler: BatchSampler,
    ) -> None:
        """The rank is ready: the start record, the start-up timeline (log), the start line,
        and the warning when the checkpoint resumed from is already at or past
        ``config.steps`` (nothing is trained then)."""
        session, timeline = self.session, self.timeline
        session.start(resumed_from_step=resumed)
        session.checkpoint_interval(config.checkpoint.every if checkpointer.enabled else 0)
        log.info(
            "rank %d: ready %.2f s after its process started (%s)",
            env.rank,
            timeline.total(),
            timeline.describe(),
            extra={
                "startup_seconds": timeline.seconds(),
                "startup_cpu_seconds": timeline.cpu_seconds(),
                "process_start": timeline.process_start,
            },
        )
        log.info("rank %d: training steps %d..%d", env.rank, sampler.next_step, config.steps)
        if progress is not None:
            progress.start(
                world_size=env.world_size,
                mesh=dims.mesh_degrees,
                resumed_from_step=resumed,
                steps=config.steps,
                checkpoint_dir=config.checkpoint.directory,
                startup_seconds=timeline.total(),
            )
        if resumed is not None and resumed >= config.steps:
            log.info(
                "rank %d: checkpoint step %d >= steps %d, nothing to train",
                env.rank,
                resumed,
                config.steps,
            )
            if progress is not None:
                progress.nothing_to_do(
                    checkpoint_step=resumed,
                    steps=config.steps,
                    checkpoint_dir=config.checkpoint.directory,
                )


@contextlib.contextmanager
def imports_without_gc() -> Iterator[None]:
    """Import the training stack with Python's cyclic garbage collector paused, then
    freeze what was imported (``gc.freeze()``: later collections skip it).

    Importing torch, DTensor, DCP and dynamo leaves about 480,000 objects tracked by the
    collector (functions, classes, dicts) and almost no cyclic garbage, yet the collector
    keeps traversing the growing heap while they load; and at exit the interpreter's
    final collection traverses all of them again. Measured on the 2-core development
    machine (a fresh interpreter that imports the loop and exits, CPU seconds, median of
    3; ``benchmarks/recovery_bench.py``, README.md "Benchmarks"): 3.5-3.8 with the
    collector as it is, 2.1-2.5 paused and frozen, about 0.4 of the saving at import and
    0.9 at exit, per rank. A restart pays both: the old ranks' exits before torchrun
    starts the new ones, and the new ones' imports, four ranks on two cores. Frozen
    objects are never collected, which costs nothing for modules (they live until the
    process ends).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _fired(session: swt.Session, step: int, point: str) -> None:
    session.fault(point, step)


__all__ = [
    "STAGES",
    "StartupStages",
    "StartupTimeline",
    "imports_without_gc",
]
