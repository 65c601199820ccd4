"""The jobs of a Slurm target that submits them (``job.submit``): ``sbatch`` of the
target's script template, one Slurm job per experiment run (and per baseline).

:class:`SubmittedSlurmJobs` is the :class:`~stormwatch.chaos.target.JobControl`:

* ``start``: ``sbatch --parsable --job-name=<name> [--nodes=<job.nodes>] <template>``
  with the template's ``parameters`` in the environment and ``TRAIN_ARGS`` (the
  deploy/slurm/train.sbatch convention: extra ``stormwatch train`` options) carrying the
  experiment's job shape: ``--job``, ``--steps``, ``--checkpoint-every``, ``--seed``,
  ``--step-delay`` and ``--global-batch``, after any ``TRAIN_ARGS`` of the parameters
  (the last occurrence of an option wins); a job with a ``command`` gets it instead as
  ``STORMWATCH_COMMAND`` (shell-quoted: the recipe runs it in place of ``stormwatch
  train``, and ``TRAIN_ARGS`` is left as the parameters give it). Elastic jobs
  (``min_nodes``) are refused: a batch script fixes its node count.
* ``exited``/``ended``: the job's ``JobState`` (``scontrol show job``): ``COMPLETED`` is
  True, a failed end state False, anything else (PENDING, a requeue, RUNNING,
  COMPLETING) None.
* ``stop``: ``scancel``, then wait until Slurm no longer runs it (the target's
  ``slurm.readback_timeout_s``).

The node count of :attr:`SubmittedSlurmJobs.world_size` is read from the template's
``#SBATCH --nodes``/``-N`` header line (sbatch's own rule: header lines end at the first
line that is neither a comment nor blank), 1 when absent.
"""

from __future__ import annotations

import logging
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from stormwatch.chaos.errors import ChaosError, LabNotReady
from stormwatch.chaos.experiment.model import JobSection
from stormwatch.contracts.journal import JobRef
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.slurm import SlurmCommands
from stormwatch.platforms.targets import SubmitJob

logger = logging.getLogger(__name__)

#: Slurm job states after which the job will not run again (``squeue --help``, JOB STATE CODES).
SLURM_FAILED = frozenset(
    {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
#: Seconds between two reads of a cancelled job's state.
_POLL_S = 0.5
_NODES = re.compile(r"(?:--nodes[= ]|-N\s*)(\d+)(?:-\d+)?")


def template_nodes(template: Path) -> int:
    """The ``#SBATCH --nodes=N`` (or ``-N N``, or the minimum of ``N-M``) of a batch
    script's header; 1 when it has none (sbatch's default).

    Raises:
        OSError: the template cannot be read.
        UnicodeDecodeError: it is not UTF-8 text (the target file's validation refuses it).
    """
    nodes = 1
    for raw in template.read_text(encoding="utf-8").splitlines()[1:]:
        line = raw.strip()
        if line and not line.startswith("#"):
            break  # sbatch stops reading #SBATCH lines at the first command
        if line.startswith("#SBATCH"):
            found = _NODES.search(line)
            if found:
                nodes = int(found[1])
    return nodes


class SubmittedSlurmJobs:
    """Starts each experiment's job with ``sbatch`` of ``submit.template`` (module
    docstring) and follows it by its Slurm job id.

    Args:
        commands: the cluster's command client (its ``slurm.conf``).
        submit: the target file's ``job.submit``.
        log_dirs: where a job's rank logs are, from its name and Slurm job id
            (:class:`~stormwatch.chaos.platform_target.JobLogDirs`).
        nproc_per_node: ranks per node (``slurm.nproc_per_node``).
        stop_timeout_s: longest wait for a cancelled job to leave its nodes (s).
    """

    #: A submitting target attaches to nothing: the runner starts the experiment's job.
    attached: str | None = None

    def __init__(
        self,
        commands: SlurmCommands,
        submit: SubmitJob,
        *,
        log_dirs: Callable[[str, str], Path],
        nproc_per_node: int,
        stop_timeout_s: float = 60.0,
    ) -> None:
        self._commands = commands
        self._submit = submit
        self._log_dirs = log_dirs
        self._nproc = nproc_per_node
        self._stop_timeout_s = stop_timeout_s
        self._ids: dict[str, str] = {}
        try:
            self.nodes = template_nodes(submit.template)
        except (OSError, UnicodeDecodeError) as exc:
            raise LabNotReady(f"job.submit.template {submit.template}: {exc}") from exc
        #: Ranks of a job of the template's node count.
        self.world_size = self.nodes * nproc_per_node

    def sbatch_args(self, job: JobSection) -> list[str]:
        """The ``sbatch`` options and script of ``job`` (module docstring)."""
        args = [f"--job-name={job.name}"]
        if job.nodes is not None:
            args.append(f"--nodes={job.nodes}")
        return [*args, str(self._submit.template)]

    def environment(self, job: JobSection) -> dict[str, str]:
        """The template's parameters, with the job's shape appended to ``TRAIN_ARGS``, or
        its ``command`` as ``STORMWATCH_COMMAND``."""
        command = job.command_line()
        if command is not None:
            return {**self._submit.parameters, "STORMWATCH_COMMAND": shlex.join(command)}
        shape = [
            "--job", job.name,
            "--steps", str(job.steps),
            "--checkpoint-every", str(job.checkpoint_every),
            "--seed", str(job.seed),
            "--step-delay", repr(job.step_delay),
        ]  # fmt: skip
        if job.global_batch is not None:
            shape += ["--global-batch", str(job.global_batch)]
        params = dict(self._submit.parameters)
        given = params.get("TRAIN_ARGS", "").strip()
        params["TRAIN_ARGS"] = " ".join(filter(None, [given, shlex.join(shape)]))
        return params

    def start(self, job: JobSection) -> JobRef:
        """Submit ``job``.

        Raises:
            ChaosError: the job is elastic, its shape does not fit the template's nodes,
                or ``sbatch`` refused it (its message).
        """
        if job.min_nodes is not None:
            raise ChaosError(
                f"job.min_nodes: job {job.name!r} is elastic; a Slurm batch script fixes its "
                "node count, so remove min_nodes to run it through job.submit"
            )
        nodes = job.nodes or self.nodes
        if job.world_size is not None and job.world_size != nodes * self._nproc:
            raise ChaosError(
                f"job.world_size: {job.world_size} ranks do not fit {nodes} node(s) of "
                f"{self._nproc} (slurm.nproc_per_node); set job.nodes or fix the world size"
            )
        client = SlurmCommands(
            conf=self._commands.conf,
            env={**self._commands.env, **self.environment(job)},
            timeout_s=self._commands.timeout_s,
            runner=self._commands.runner,
        )
        try:
            job_id = client.submit(self.sbatch_args(job))
        except BackendError as exc:
            raise ChaosError(f"could not submit job {job.name!r}: {exc}") from exc
        self._ids[job.name] = job_id
        logger.info("submitted job %s as Slurm job %s", job.name, job_id)
        return JobRef(
            name=job.name,
            log_dir=self._log_dirs(job.name, job_id),
            world_size=nodes * self._nproc,
            started_by_runner=True,
        )

    def _id(self, name: str) -> str:
        if name in self._ids:
            return self._ids[name]
        try:
            known = self._commands.jobs_named(name)
        except BackendError as exc:
            raise LabNotReady(f"job {name!r}: {exc}") from exc
        if not known:
            raise LabNotReady(f"no Slurm job named {name!r} (it was not submitted here)")
        return known[-1].job_id

    def attach(self, name: str) -> JobRef:
        job_id = self._id(name)
        return JobRef(
            name=name,
            log_dir=self._log_dirs(name, job_id),
            world_size=self.world_size,
            started_by_runner=name in self._ids,
        )

    def log_dir(self, name: str) -> Path:
        return self._log_dirs(name, self._id(name))

    def _state(self, name: str) -> str | None:
        try:
            return self._commands.job(self._id(name)).state
        except (BackendError, LabNotReady) as exc:
            logger.warning("Slurm job of %s: state unknown: %s", name, exc)
            return None

    def exited(self, name: str) -> bool | None:
        state = self._state(name)
        if state == "COMPLETED":
            return True
        return False if state in SLURM_FAILED else None

    def ended(self, name: str) -> bool:
        return self.exited(name) is not None

    def stop(self, name: str) -> None:
        """``scancel`` the job and wait until Slurm no longer runs it.

        Raises:
            ChaosError: it was not submitted here, ``scancel`` failed, or it still runs
                after the stop timeout.
        """
        job_id = self._ids.get(name)
        if job_id is None:
            raise ChaosError(f"cannot stop job {name!r}: it was not submitted by this run")
        try:
            self._commands(["scancel", job_id])
        except BackendError as exc:
            raise ChaosError(f"could not cancel Slurm job {job_id} ({name}): {exc}") from exc
        deadline = time.monotonic() + self._stop_timeout_s
        while self._state(name) in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            if time.monotonic() > deadline:
                raise ChaosError(
                    f"Slurm job {job_id} ({name}) still runs {self._stop_timeout_s:g} s "
                    "after scancel"
                )
            time.sleep(_POLL_S)


__all__ = ["SLURM_FAILED", "SubmittedSlurmJobs", "template_nodes"]
