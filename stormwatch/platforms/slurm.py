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

:class:`SlurmCommands` is the one Slurm command client (the backend's default runner, and
what the lab's Slurm cluster, :mod:`stormwatch.lab.slurm`, reads its state with): it points
every command at one ``slurm.conf`` (``SLURM_CONF``) and reads nodes and jobs back from
``scontrol --oneliner`` as :class:`SlurmNodeInfo` / :class:`SlurmJobInfo`.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.platforms.base import request_checkpoint_in, write_diagnostics
from stormwatch.platforms.errors import BackendError

#: Runs one command line and returns its standard output; raises BackendError on failure.
CommandRunner = Callable[[Sequence[str]], str]

#: Seconds one Slurm command may take.
COMMAND_TIMEOUT_S = 30.0

#: A ``Key=value`` pair of ``scontrol --oneliner`` output; a value runs up to the next
#: `` Key=`` (values such as ``Reason=link cut [root@...]`` or ``OS=Linux 6.1 ...`` hold spaces).
_PAIR = re.compile(r"([A-Za-z][\w:/]*)=(.*?)(?=\s+[A-Za-z][\w:/]*=|\s*$)")


@dataclass(frozen=True, kw_only=True)
class SlurmCommands:
    """The Slurm command client: runs ``squeue``, ``scontrol``, ``sinfo``, ``sbatch`` ...
    (no shell) against one cluster and reads its state back as typed records.

    An instance is a :data:`CommandRunner` (call it with an argument list), so it is what
    :class:`SlurmBackend` runs its commands with.

    Attributes:
        conf: the cluster's ``slurm.conf``, passed as ``SLURM_CONF`` (None: the
            environment's or the system's, ``/etc/slurm/slurm.conf``).
        env: extra environment variables of every command (over this process's).
        timeout_s: seconds one command may take (:data:`COMMAND_TIMEOUT_S`).
    """

    conf: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = COMMAND_TIMEOUT_S

    def environment(self) -> dict[str, str]:
        """The commands' environment: this process's, then :attr:`env`, then ``SLURM_CONF``."""
        merged = {**os.environ, **self.env}
        if self.conf is not None:
            merged["SLURM_CONF"] = str(self.conf)
        return merged

    def __call__(self, argv: Sequence[str]) -> str:
        """Run ``argv`` and return its stdout.

        Raises:
            BackendError: the program is missing, timed out or exited non-zero (its
                stderr in the message).
        """
        try:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            raise BackendError(
                f"{argv[0]}: not found; is this a Slurm login/controller node?"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise BackendError(f"{' '.join(argv)}: timed out after {self.timeout_s:g} s") from exc
        if done.returncode != 0:
            raise BackendError(
                f"{' '.join(argv)}: exit status {done.returncode}: {done.stderr.strip()}"
            )
        return done.stdout

    def nodes(self) -> dict[str, SlurmNodeInfo]:
        """Every node of the cluster by name (``scontrol --oneliner show node``)."""
        records = parse_oneliner(self(["scontrol", "--oneliner", "show", "node"]))
        return {r["NodeName"]: SlurmNodeInfo.of(r) for r in records if "NodeName" in r}

    def job(self, job_id: str) -> SlurmJobInfo:
        """Job ``job_id`` (``scontrol --oneliner show job``; Slurm forgets a finished job
        ``MinJobAge``, 300 s by default, after it ended).

        Raises:
            BackendError: no such job (any more), or the command failed.
        """
        records = parse_oneliner(self(["scontrol", "--oneliner", "show", "job", job_id]))
        if not records or "JobId" not in records[0]:
            raise BackendError(f"scontrol show job {job_id}: no such job")
        return SlurmJobInfo.of(records[0])

    def jobs_named(self, name: str) -> list[SlurmJobInfo]:
        """Every job slurmctld still knows whose ``JobName`` is ``name``, oldest first
        (``scontrol --oneliner show job``; finished jobs stay ``MinJobAge``, 300 s)."""
        records = parse_oneliner(self(["scontrol", "--oneliner", "show", "job"]))
        found = [SlurmJobInfo.of(r) for r in records if r.get("JobName") == name and "JobId" in r]
        return sorted(found, key=lambda job: int(job.job_id) if job.job_id.isdigit() else 0)

    def hostnames(self, nodelist: str) -> list[str]:
        """The node names of a compressed list (``node[0-1]`` -> ``node0``, ``node1``), in
        Slurm's order, which is the order of ``SLURM_NODEID`` (``scontrol show hostnames``)."""
        out = self(["scontrol", "show", "hostnames", nodelist]) if nodelist else ""
        return [line.strip() for line in out.splitlines() if line.strip()]

    def submit(self, args: Sequence[str]) -> str:
        """``sbatch --parsable ARGS``; returns the new job's id."""
        out = self(["sbatch", "--parsable", *args]).strip()
        # --parsable prints "<jobid>" or "<jobid>;<cluster>".
        return out.split(";", 1)[0]

    def update_node(self, node: str, state: str, reason: str | None = None) -> None:
        """``scontrol update NodeName=<node> State=<state> [Reason=<reason>]`` (``DRAIN``
        needs a reason; ``RESUME`` returns a drained or DOWN node to service)."""
        argv = ["scontrol", "update", f"NodeName={node}", f"State={state}"]
        self([*argv, f"Reason={reason}"] if reason is not None else argv)


def run_command(argv: Sequence[str]) -> str:
    """Run ``argv`` with the environment's Slurm configuration (``SlurmCommands()(argv)``).

    Raises:
        BackendError: see :meth:`SlurmCommands.__call__`.
    """
    return SlurmCommands()(argv)


def parse_oneliner(text: str) -> list[dict[str, str]]:
    """Records of ``scontrol --oneliner show node|job`` output: one ``{Key: value}`` per line."""
    return [
        {key: value.strip() for key, value in _PAIR.findall(line)}
        for line in text.splitlines()
        if line.strip()
    ]


@dataclass(frozen=True)
class SlurmNodeInfo:
    """One node as ``scontrol show node`` reports it.

    Attributes:
        name: ``NodeName``.
        state: ``State``: a base state and ``+``-joined flags (``IDLE``, ``MIXED``,
            ``IDLE+DRAIN``, ``DOWN+NOT_RESPONDING`` ...).
        reason: ``Reason`` (why it is drained or down; Slurm appends ``[user@time]``), or None.
    """

    name: str
    state: str
    reason: str | None = None

    @classmethod
    def of(cls, record: Mapping[str, str]) -> SlurmNodeInfo:
        reason = record.get("Reason")
        return cls(record["NodeName"], record.get("State", ""), reason or None)

    @property
    def base_state(self) -> str:
        """The state without flags (``IDLE`` of ``IDLE+DRAIN``)."""
        return self.state.split("+", 1)[0]

    @property
    def flags(self) -> frozenset[str]:
        """The state's flags (``{"DRAIN"}`` of ``IDLE+DRAIN``)."""
        return frozenset(self.state.split("+")[1:])


@dataclass(frozen=True)
class SlurmJobInfo:
    """One job as ``scontrol show job`` reports it.

    Attributes:
        job_id: ``JobId``; name: ``JobName``.
        state: ``JobState`` (``PENDING``, ``RUNNING``, ``COMPLETING``, ``COMPLETED``,
            ``FAILED``, ``CANCELLED`` ...).
        nodes: ``NodeList`` in Slurm's compressed form (``node[0-1]``), "" while pending.
        reason: ``Reason`` (why it waits or failed; ``None`` for Slurm's ``None``).
        exit_code: ``ExitCode`` (``<status>:<signal>``).
    """

    job_id: str
    name: str
    state: str
    nodes: str
    reason: str | None
    exit_code: str

    @classmethod
    def of(cls, record: Mapping[str, str]) -> SlurmJobInfo:
        nodes = record.get("NodeList", "")
        reason = record.get("Reason", "None")
        return cls(
            job_id=record["JobId"],
            name=record.get("JobName", ""),
            state=record.get("JobState", ""),
            nodes="" if nodes == "(null)" else nodes,
            reason=None if reason == "None" else reason,
            exit_code=record.get("ExitCode", ""),
        )


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


__all__ = [
    "COMMAND_TIMEOUT_S",
    "CommandRunner",
    "SlurmBackend",
    "SlurmCommands",
    "SlurmJob",
    "SlurmJobInfo",
    "SlurmNodeInfo",
    "parse_oneliner",
    "run_command",
]
