"""The soak's job on the lab: how it is started, stopped, shrunk and grown (:class:`SoakLab`),
and what its rank 0 says (:class:`RankZeroLog`).

The job is elastic (``min_nodes: 1``) so that a node can leave and rejoin; the lab starts
elastic jobs itself, one torchrun per node (the Slurm recipe runs fixed-size jobs, so
:func:`stormwatch.lab.jobs.slurmjob.uses_slurm` leaves them out). Every action is the lab's
own (:class:`stormwatch.lab.Lab`): the job launcher ``start_job``, ``stop_job`` (SIGTERM to
every torchrun and worker, SIGKILL after the grace period: what ``stormwatch lab stop`` and
Slurm's ``scancel`` do), ``leave_job_node`` (SIGTERM to one node's torchrun) and
``rejoin_job_node`` (that node's torchrun started again).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

from stormwatch.chaos.errors import ChaosError, LabNotReady
from stormwatch.chaos.soak.settings import SoakSettings
from stormwatch.clients.prometheus import PrometheusAPI, PrometheusClient
from stormwatch.errors import StormwatchError
from stormwatch.lab import JobSpec, Lab
from stormwatch.telemetry.events import CheckpointEvent, StartEvent, StepEvent, parse_events

#: Seconds a leaving node's torchrun gets between SIGTERM and SIGKILL: torchrun's own time
#: for its workers to stop (``PContext.close``'s 30 s), so that the leave stays graceful on a
#: loaded machine (5 s, the lab's grace period, was not always enough on 2 busy cores).
LEAVE_GRACE_SECONDS = 30.0
#: The soak's job never runs out of steps: the soak ends it (10 million steps are ~80 days
#: at the default pace).
UNBOUNDED_STEPS = 10_000_000


def soak_job_spec(name: str, settings: SoakSettings) -> JobSpec:
    """The soak's job: elastic (1 node up to the lab's job nodes), checkpoints and evaluation
    pauses per ``settings``, more steps than the soak will train."""
    return JobSpec(
        name=name,
        steps=UNBOUNDED_STEPS,
        checkpoint_every=settings.checkpoint_every,
        seed=settings.seed,
        step_delay=settings.step_delay,
        min_nodes=1,
        extra_args=settings.trainer_args(),
    )


class SoakLab(Protocol):
    """What the soak asks of the lab (a test passes a stand-in).

    Attributes:
        run_dir: the lab's run directory.
        prometheus: its Prometheus.
        evaluation_interval: its rules' evaluation interval, seconds.
    """

    run_dir: Path
    prometheus: PrometheusAPI
    evaluation_interval: float

    def start(self, spec: JobSpec) -> Path:
        """Start ``spec`` (again: it resumes from its checkpoints); returns its log folder."""
        ...

    def stop(self, name: str) -> None:
        """Stop the job: SIGTERM to every process, SIGKILL after the grace period."""
        ...

    def nodes(self, name: str) -> list[str]:
        """The job's nodes, the rendezvous host first."""
        ...

    def leave(self, name: str, node: str) -> int | None:
        """``node`` leaves the job gracefully; its torchrun's exit status."""
        ...

    def rejoin(self, name: str, node: str) -> None:
        """``node``'s torchrun starts again and joins the job."""
        ...

    def ended(self, name: str) -> bool:
        """Whether every node's torchrun of the job has exited."""
        ...


class LabSoak:
    """:class:`SoakLab` over the lab in ``run_dir``.

    Raises:
        LabNotReady: no lab there, or it is not up.
    """

    def __init__(self, run_dir: Path) -> None:
        self._lab = Lab(Path(run_dir))
        try:
            state = self._lab.state
        except StormwatchError as exc:
            raise LabNotReady(str(exc)) from exc
        if state.phase != "up":
            raise LabNotReady(
                f"the lab in {run_dir} is {state.phase!r}, not 'up'; start it with "
                f"`stormwatch lab up --run-dir {run_dir}`"
            )
        self.run_dir = Path(state.run_dir)
        self.prometheus: PrometheusAPI = PrometheusClient(state.prometheus_url)
        self.evaluation_interval = state.config.scrape_interval
        self.job_nodes = [n.name for n in state.nodes[: state.config.job_nodes]]

    def start(self, spec: JobSpec) -> Path:
        try:
            return Path(self._lab.start_job(spec).log_dir)
        except StormwatchError as exc:
            raise ChaosError(f"could not start job {spec.name!r} on the lab: {exc}") from exc

    def stop(self, name: str) -> None:
        try:
            self._lab.stop_job(name)
        except StormwatchError as exc:
            raise ChaosError(f"could not stop job {name!r}: {exc}") from exc

    def nodes(self, name: str) -> list[str]:
        try:
            return list(self._lab.job(name).node_pids) or list(self.job_nodes)
        except StormwatchError:
            return list(self.job_nodes)

    def leave(self, name: str, node: str) -> int | None:
        try:
            return self._lab.leave_job_node(name, node, grace=LEAVE_GRACE_SECONDS)
        except StormwatchError as exc:
            raise ChaosError(f"{node} could not leave job {name!r}: {exc}") from exc

    def rejoin(self, name: str, node: str) -> None:
        try:
            self._lab.rejoin_job_node(name, node)
        except StormwatchError as exc:
            raise ChaosError(f"{node} could not rejoin job {name!r}: {exc}") from exc

    def ended(self, name: str) -> bool:
        try:
            codes = self._lab.job_result(name).exit_codes
        except StormwatchError:
            return True
        return all(code is not None for code in codes.values())


class RankZeroLog:
    """Follows a job's ``rank0.jsonl`` (the worker group's rank 0, whichever node holds it),
    reading only what was appended since the last :meth:`poll`.

    Attributes:
        starts: every start of the worker group (world size, step resumed from), in order.
        checkpoints: every committed checkpoint, in order.
        last_step: the latest step record.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.starts: list[StartEvent] = []
        self.checkpoints: list[CheckpointEvent] = []
        self.last_step: StepEvent | None = None

    def poll(self) -> None:
        """Read the complete lines appended since the last poll (none when the file is not
        there yet; a torn last line waits for its end)."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        events, _ = parse_events(complete.decode("utf-8", errors="replace"))
        for event in events:
            if isinstance(event, StartEvent):
                self.starts.append(event)
            elif isinstance(event, CheckpointEvent):
                self.checkpoints.append(event)
            elif isinstance(event, StepEvent):
                self.last_step = event

    def checkpoint_after(self, at: float) -> CheckpointEvent | None:
        """The first checkpoint committed after wall time ``at``."""
        return next((c for c in self.checkpoints if c.time > at), None)

    def step_after(self, at: float) -> bool:
        """Whether a step completed after wall time ``at``."""
        return self.last_step is not None and self.last_step.time > at

    @property
    def step(self) -> int | None:
        """The latest step completed."""
        return None if self.last_step is None else self.last_step.step

    @property
    def world_size(self) -> int | None:
        """The world size of the latest start (``None`` before the first)."""
        return self.starts[-1].world_size if self.starts else None


def whole_minutes(seconds: float) -> str:
    """``12 min`` / ``40 s``: a wait in words."""
    return f"{math.ceil(seconds / 60)} min" if seconds >= 120 else f"{seconds:.0f} s"


__all__ = [
    "LEAVE_GRACE_SECONDS",
    "UNBOUNDED_STEPS",
    "LabSoak",
    "RankZeroLog",
    "SoakLab",
    "soak_job_spec",
    "whole_minutes",
]
