"""The Slurm platform backend, through ``squeue`` and ``scontrol``.

A job's workers are the running Slurm job whose name (``sbatch --job-name``) is
the stormwatch job name (deploy/slurm/train.sbatch sets both). Placement follows
the recipe's launch: one ``srun`` task per node running torchrun with
``--node-rank=$SLURM_NODEID``; Slurm numbers nodes in the order
``scontrol show hostnames <nodelist>`` prints them, so node ``i`` holds global
ranks ``i * nproc .. i * nproc + nproc - 1``.

Commands (run through :attr:`SlurmBackend.runner`, a seam tests replace):

* find the job: ``squeue --noheader --name=<job> --states=RUNNING --format=%i|%N``;
* restart workers: ``scontrol requeue <jobid>`` (the job needs ``--requeue``; it
  restarts from its last checkpoint on a fresh allocation);
* exclude a node: ``scontrol update NodeName=<node> State=DRAIN Reason=<why>``, then
  ``scontrol requeue <jobid>``: the drained node is not allocated again;
* checkpoint now: the trainer's control file on the shared filesystem
  (:attr:`SlurmBackend.control_dir`, ``{job}`` and ``{jobid}`` substituted);
* collect diagnostics: ``scontrol --details show job <jobid>`` and
  ``squeue --steps --jobs=<jobid>``, written to ``<diagnostics_dir>/incident-<id>.json``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.platforms.base import request_checkpoint_in, write_diagnostics
from stormwatch.platforms.errors import BackendError

#: Runs one command line and returns its standard output; raises BackendError on failure.
CommandRunner = Callable[[Sequence[str]], str]

#: Seconds one Slurm command may take.
COMMAND_TIMEOUT_S = 30.0


def run_command(argv: Sequence[str]) -> str:
    """Run ``argv`` (no shell) and return its stdout.

    Raises:
        BackendError: the program is missing, timed out or exited non-zero (its
            stderr in the message).
    """
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except FileNotFoundError as exc:
        raise BackendError(f"{argv[0]}: not found; is this a Slurm login/controller node?") from exc
    except subprocess.TimeoutExpired as exc:
        raise BackendError(f"{' '.join(argv)}: timed out after {COMMAND_TIMEOUT_S:g} s") from exc
    if done.returncode != 0:
        raise BackendError(
            f"{' '.join(argv)}: exit status {done.returncode}: {done.stderr.strip()}"
        )
    return done.stdout


@dataclass(frozen=True)
class SlurmJob:
    """A running Slurm job: its id and its nodes, in node-rank order."""

    job_id: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class SlurmBackend:
    """The Slurm backend (module docstring).

    Attributes:
        diagnostics_dir: where ``collect_diagnostics`` writes (created on demand).
        nproc_per_node: torchrun ``--nproc-per-node`` of the recipe (ranks per node).
        control_dir: the trainer's control directory on the shared filesystem, with
            ``{job}``/``{jobid}`` placeholders; None: ``request_checkpoint`` raises.
        runner: runs a command line, returns stdout (default :func:`run_command`).
        clock: Unix time source (seconds).
    """

    diagnostics_dir: Path
    nproc_per_node: int = 1
    control_dir: str | None = None
    runner: CommandRunner = field(default=run_command)
    clock: Callable[[], float] = field(default=time.time)

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise BackendError(f"nproc_per_node: must be >= 1 (got {self.nproc_per_node})")

    def find(self, job: str) -> SlurmJob:
        """The running Slurm job named ``job``.

        Raises:
            BackendError: none (or more than one) is running, or a command failed.
        """
        out = self.runner(
            ["squeue", "--noheader", f"--name={job}", "--states=RUNNING", "--format=%i|%N"]
        )
        rows = [line.split("|", 1) for line in out.splitlines() if line.strip()]
        if not rows:
            raise BackendError(f"no live worker of job {job!r} found (no running Slurm job)")
        if len(rows) > 1:
            ids = ", ".join(r[0] for r in rows)
            raise BackendError(f"job {job!r}: several running Slurm jobs ({ids}); name one")
        job_id, nodelist = rows[0][0].strip(), (rows[0][1] if len(rows[0]) > 1 else "").strip()
        hosts = self.runner(["scontrol", "show", "hostnames", nodelist]) if nodelist else ""
        return SlurmJob(job_id, tuple(h.strip() for h in hosts.splitlines() if h.strip()))

    def ranks(self, job: str) -> dict[int, str]:
        """Global rank -> node (node ``i`` of the allocation holds ranks ``i*nproc..``)."""
        nproc = self.nproc_per_node
        found = self.find(job)
        return {i * nproc + r: node for i, node in enumerate(found.nodes) for r in range(nproc)}

    def restart_workers(self, job: str) -> str:
        """``scontrol requeue`` the job."""
        found = self.find(job)
        self.runner(["scontrol", "requeue", found.job_id])
        return f"requeued Slurm job {found.job_id} ({job})"

    def exclude_node_and_restart(self, job: str, node: str) -> str:
        """Drain ``node`` with a reason, then requeue the job."""
        found = self.find(job)
        if node not in found.nodes:
            raise BackendError(f"job {job!r} has no live worker on node {node!r}")
        reason = f"stormwatch: excluded from job {job} ({found.job_id})"
        self.runner(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
        self.runner(["scontrol", "requeue", found.job_id])
        return f"drained {node} and requeued Slurm job {found.job_id} ({job})"

    def request_checkpoint(self, job: str) -> str:
        """Arm ``checkpoint_now`` in rank 0's control file on the shared filesystem."""
        found = self.find(job)
        if self.control_dir is None:
            raise BackendError(
                "checkpoint_now on slurm needs the trainer's control directory on the shared "
                "filesystem (platform setting control_dir, e.g. /shared/{job}/control)"
            )
        path = Path(self.control_dir.format(job=job, jobid=found.job_id)) / "rank0.json"
        return request_checkpoint_in(path, job, self.clock())

    def collect_diagnostics(self, job: str, incident_id: int) -> str:
        """Write ``scontrol --details show job`` and the job's steps to ``incident-<id>.json``."""
        found = self.find(job)
        report = {
            "job": job,
            "platform": "slurm",
            "time": self.clock(),
            "job_id": found.job_id,
            "nodes": list(found.nodes),
            "scontrol_show_job": self.runner(
                ["scontrol", "--details", "show", "job", found.job_id]
            ),
            "steps": self.runner(["squeue", "--steps", f"--jobs={found.job_id}"]),
        }
        path = write_diagnostics(self.diagnostics_dir, incident_id, report)
        return f"diagnostics of Slurm job {found.job_id} ({job}) in {path}"


__all__ = ["COMMAND_TIMEOUT_S", "CommandRunner", "SlurmBackend", "SlurmJob", "run_command"]
