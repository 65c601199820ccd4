"""The backend of a lab whose scheduler is Slurm: Slurm for its Slurm jobs, the lab's
processes for the jobs the lab launched directly.

On the Slurm lab (``LabConfig.scheduler`` ``slurm``, the target file ``lab up`` writes is a
``slurm`` target with a ``lab:`` section) a fixed-size training job is a Slurm job
(``sbatch`` of deploy/slurm/train.sbatch, ``--job-name`` = the job's name), and the
responder acts on it through Slurm (:class:`~.slurm.SlurmBackend`: requeue, drain and
exclude, each read back). Elastic jobs and jobs with a custom entrypoint are still started
by the lab itself, one torchrun per node (the recipe runs a fixed-size ``stormwatch
train``): Slurm does not know them, so their actions go to :class:`~.lab.LabBackend`
(signals to the job's processes, its control files), and each answer says so.

A requeue on the lab confirms more than Slurm can: the lab shares one PID namespace, so
before the requeued job starts again every process that still carries the job's
``SLURM_JOB_ID`` (:func:`slurm_job_processes`: a rank orphaned when its torchrun died,
which ``proctrack/linuxproc`` no longer finds under the step) is stopped like the lab's
own (:mod:`.stopping`) and confirmed gone.

Which backend a job gets is decided per call: Slurm when slurmctld holds a job of that
name in an active state (:data:`~.slurm.ACTIVE_STATES`: pending, running, completing,
requeued ...), else the lab's processes when the job has live workers there, else Slurm
again, whose error names what it looked for ("no running Slurm job").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import psutil

from stormwatch.platforms.lab import LabBackend
from stormwatch.platforms.slurm import ACTIVE_STATES, SlurmBackend
from stormwatch.platforms.slurm_readback import SlurmStop
from stormwatch.platforms.stopping import require_gone, stop_processes

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: How an action's answer says that the lab's processes, not Slurm, carried it out.
DIRECT_NOTE = "not a Slurm job (launched directly by the lab): "
#: Slurm's own daemons: they may carry a job's variables but are Slurm's to stop.
SLURM_DAEMONS = frozenset({"slurmstepd", "slurmd", "slurmctld"})


def slurm_job_processes(job_id: str) -> list[psutil.Process]:
    """Every process on this machine whose environment has ``SLURM_JOB_ID=<job_id>`` (the
    job's batch script, ``srun``, torchrun, ranks; Slurm's daemons left out): on the lab,
    whose nodes share one PID namespace, what is left of the job wherever it ran."""
    found = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in SLURM_DAEMONS:
            continue
        try:
            if proc.environ().get("SLURM_JOB_ID") == job_id:
                found.append(proc)
        except psutil.Error:  # gone, or not ours to read: not one of the job's
            continue
    return found


def stop_slurm_job_leftovers(job_id: str, *, grace_s: float) -> str:
    """Stop what is left of Slurm job ``job_id`` on this machine (:func:`slurm_job_processes`)
    and confirm it gone: SIGTERM, SIGKILL after ``grace_s``; what was done, in words.

    Raises:
        NotStopped: a process survived SIGKILL.
    """
    left = slurm_job_processes(job_id)
    if not left:
        return f"no process of Slurm job {job_id} left"
    stopped = stop_processes(left, grace_s=grace_s)
    log.warning(
        "Slurm job %s: %d processes Slurm no longer tracked (pids %s): %s",
        job_id,
        len(left),
        [p.pid for p in left],
        stopped.describe(),
    )
    require_gone(stopped, f"the processes left of Slurm job {job_id}")
    return f"stopped {len(left)} processes left of Slurm job {job_id}: {stopped.describe()}"


@dataclass(frozen=True, kw_only=True)
class LabSlurmBackend:
    """:class:`~.base.PlatformBackend` of the Slurm lab (module docstring).

    Attributes:
        slurm: the backend of the lab's Slurm cluster (its ``slurm.conf``).
        lab: the lab's process backend, for jobs Slurm does not run.
    """

    slurm: SlurmBackend
    lab: LabBackend

    def _requeuing(self) -> SlurmBackend:
        """:attr:`slurm` whose requeues also stop what of the old run Slurm lost track of
        (module docstring), with the lab's grace period."""
        grace = self.lab.grace_period_s

        def leftovers(job_id: str) -> str:
            return stop_slurm_job_leftovers(job_id, grace_s=grace)

        stop = SlurmStop(grace_s=self.slurm.stop.grace_s, leftovers=leftovers)
        return dataclasses.replace(self.slurm, stop=stop)

    def is_slurm_job(self, job: str) -> bool:
        """Whether slurmctld holds a job named ``job`` in an active state.

        Raises:
            BackendError: Slurm cannot be asked.
        """
        return any(info.state in ACTIVE_STATES for info in self.slurm.commands.jobs_named(job))

    def _route(self, job: str, on_slurm: Callable[[], _T], on_lab: Callable[[], _T]) -> _T:
        if self.is_slurm_job(job) or not self.lab.workers(job):
            return on_slurm()
        return on_lab()

    def ranks(self, job: str) -> Mapping[int, str]:
        """Global rank -> node, from Slurm's allocation or the lab's live workers."""
        return self._route(job, lambda: self.slurm.ranks(job), lambda: self.lab.ranks(job))

    def restart_workers(self, job: str) -> str:
        """Slurm: requeue and start at once; a direct job: SIGTERM its workers."""
        return self._route(
            job,
            lambda: self._requeuing().restart_workers(job),
            lambda: DIRECT_NOTE + self.lab.restart_workers(job),
        )

    def exclude_node_and_restart(self, job: str, node: str) -> str:
        """Slurm: drain ``node``, requeue without it (onto a spare); a direct (elastic)
        job: SIGTERM its torchrun agents on ``node`` (it re-rendezvous smaller)."""
        return self._route(
            job,
            lambda: self._requeuing().exclude_node_and_restart(job, node),
            lambda: DIRECT_NOTE + self.lab.exclude_node_and_restart(job, node),
        )

    def request_checkpoint(self, job: str) -> str:
        """Arm ``checkpoint_now`` in rank 0's control file (both kinds of job)."""
        return self._route(
            job,
            lambda: self.slurm.request_checkpoint(job),
            lambda: DIRECT_NOTE + self.lab.request_checkpoint(job),
        )

    def collect_diagnostics(self, job: str, incident_id: int) -> str:
        """Slurm's view of the job (``scontrol``, ``squeue --steps``), or the workers' stacks."""
        return self._route(
            job,
            lambda: self.slurm.collect_diagnostics(job, incident_id),
            lambda: DIRECT_NOTE + self.lab.collect_diagnostics(job, incident_id),
        )


__all__ = [
    "DIRECT_NOTE",
    "SLURM_DAEMONS",
    "LabSlurmBackend",
    "slurm_job_processes",
    "stop_slurm_job_leftovers",
]
