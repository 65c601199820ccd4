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

Which backend a job gets is decided per call: Slurm when slurmctld holds a job of that
name in an active state (:data:`~.slurm.ACTIVE_STATES`: pending, running, completing,
requeued ...), else the lab's processes when the job has live workers there, else Slurm
again, whose error names what it looked for ("no running Slurm job").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from stormwatch.platforms.lab import LabBackend
from stormwatch.platforms.slurm import ACTIVE_STATES, SlurmBackend

_T = TypeVar("_T")

#: How an action's answer says that the lab's processes, not Slurm, carried it out.
DIRECT_NOTE = "not a Slurm job (launched directly by the lab): "


@dataclass(frozen=True, kw_only=True)
class LabSlurmBackend:
    """:class:`~.base.PlatformBackend` of the Slurm lab (module docstring).

    Attributes:
        slurm: the backend of the lab's Slurm cluster (its ``slurm.conf``).
        lab: the lab's process backend, for jobs Slurm does not run.
    """

    slurm: SlurmBackend
    lab: LabBackend

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
            lambda: self.slurm.restart_workers(job),
            lambda: DIRECT_NOTE + self.lab.restart_workers(job),
        )

    def exclude_node_and_restart(self, job: str, node: str) -> str:
        """Slurm: drain ``node``, requeue without it (onto a spare); a direct (elastic)
        job: SIGTERM its torchrun agents on ``node`` (it re-rendezvous smaller)."""
        return self._route(
            job,
            lambda: self.slurm.exclude_node_and_restart(job, node),
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


__all__ = ["DIRECT_NOTE", "LabSlurmBackend"]
