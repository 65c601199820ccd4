"""The Slurm platform backend, through ``squeue`` and ``scontrol``.

A job's workers are the running Slurm job whose name (``sbatch --job-name``) is
the stormwatch job name (deploy/slurm/train.sbatch sets both). Placement follows
the recipe's launch: one ``srun`` task per node running torchrun with
``--node-rank=$SLURM_NODEID``; Slurm numbers nodes in the order
``scontrol show hostnames <nodelist>`` prints them, so node ``i`` holds global
ranks ``i * nproc .. i * nproc + nproc - 1``.

Actions, each read back from Slurm (``scontrol --oneliner show job|node``) within a bounded
wait (:mod:`.slurm_readback`), a :class:`BackendError` naming the state last seen otherwise;
the job is found by name, then addressed by its id (never by a step number):

* find the job: ``squeue --noheader --name=<job> --states=RUNNING --format=%i|%N``;
* restart workers: ``scontrol requeue <jobid>`` (the job needs ``--requeue``; Slurm sends
  SIGTERM, SIGKILL after ``KillWait``); once it is PENDING with no step left (the old run
  gone, :mod:`.stopping`), ``scontrol update JobId=<jobid> StartTime=<requeue + 2 s>`` (the
  requeue revoked the job's credential for that second, :data:`.slurm_readback.CREDENTIAL_GAP_S`);
  read back RUNNING with one restart more and its batch step launched (``squeue --steps``);
* exclude a node: ``scontrol update NodeName=<node> State=DRAIN Reason=<why>`` (read back:
  the DRAIN flag and that reason), then requeue, and while PENDING ``scontrol update
  JobId=<jobid> ExcNodeList=<node>`` and ``StartTime``; read back RUNNING on nodes
  without ``<node>`` (the spare);
* a node back in service (:meth:`SlurmBackend.resume_node`, after a partition healed):
  ``scontrol update NodeName=<node> State=RESUME``, read back IDLE/MIXED/ALLOCATED
  without DRAIN or NOT_RESPONDING;
* checkpoint now: rank 0's control file (:attr:`SlurmBackend.control_dir`, ``{job}``,
  ``{jobid}`` and ``{node}``, rank 0's node, substituted: :func:`~.base.control_dir_for`);
* collect diagnostics: ``scontrol --details show job <jobid>``, ``scontrol show node
  <its nodes>`` and ``squeue --steps --jobs=<jobid>``, written to
  ``<diagnostics_dir>/incident-<id>.json``.

:class:`SlurmCommands` is the one Slurm command client (the backend's default runner, and
what the lab's Slurm cluster, :mod:`stormwatch.lab.slurm`, reads its state with): it points
every command at one ``slurm.conf`` (``SLURM_CONF``) and reads nodes and jobs back from
``scontrol --oneliner`` as :class:`SlurmNodeInfo` / :class:`SlurmJobInfo`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.platforms.base import control_dir_for, request_checkpoint_in, write_diagnostics
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.slurm_readback import (
    SlurmStop,
    SlurmWait,
    drained,
    in_service,
    requeue_and_start,
)

#: Runs one command line and returns its standard output; raises BackendError on failure.
CommandRunner = Callable[[Sequence[str]], str]

#: Seconds one Slurm command may take.
COMMAND_TIMEOUT_S = 30.0
#: Job states in which Slurm still holds the job (or will again: pending, requeued).
ACTIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}
)

#: A ``Key=value`` pair of ``scontrol --oneliner`` output; a value runs up to the next
#: `` Key=`` (values such as ``Reason=link cut [root@...]`` or ``OS=Linux 6.1 ...`` hold spaces).
_PAIR = re.compile(r"([A-Za-z][\w:/]*)=(.*?)(?=\s+[A-Za-z][\w:/]*=|\s*$)")
#: The ``[user@time]`` Slurm appends to a node's reason.
_REASON_STAMP = re.compile(r"\s*\[[^\]@]*@([^\]]+)\]\s*$")


@dataclass(frozen=True, kw_only=True)
class SlurmCommands:
    """The Slurm command client: runs ``squeue``, ``scontrol``, ``sinfo``, ``sbatch`` ...
    (no shell) against one cluster and reads its state back as typed records.

    An instance is a :data:`CommandRunner` (call it with an argument list), so it is what
    :class:`SlurmBackend` runs its commands with; every method below goes through it.

    Attributes:
        conf: the cluster's ``slurm.conf``, passed as ``SLURM_CONF`` (None: the
            environment's or the system's, ``/etc/slurm/slurm.conf``).
        env: extra environment variables of every command (over this process's).
        timeout_s: seconds one command may take (:data:`COMMAND_TIMEOUT_S`).
        runner: runs the command lines instead of the programs (a test seam: a recorded
            cluster); None runs them.
    """

    conf: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = COMMAND_TIMEOUT_S
    runner: CommandRunner | None = None

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
        if self.runner is not None:
            return self.runner(argv)
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

    def nodes(self, *names: str) -> dict[str, SlurmNodeInfo]:
        """The nodes ``names`` (every node when none) by name (``scontrol --oneliner show
        node [a,b]``)."""
        argv = ["scontrol", "--oneliner", "show", "node"]
        records = parse_oneliner(self([*argv, ",".join(names)] if names else argv))
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

    def jobs(self) -> list[SlurmJobInfo]:
        """Every job slurmctld still knows (``scontrol --oneliner show job``), any state."""
        records = parse_oneliner(self(["scontrol", "--oneliner", "show", "job"]))
        return [SlurmJobInfo.of(r) for r in records if "JobId" in r]

    def running_jobs(self, name: str) -> list[tuple[str, str]]:
        """``(job id, node list)`` of each RUNNING job named ``name`` (``squeue --name``)."""
        out = self(["squeue", "--noheader", f"--name={name}", "--states=RUNNING", "--format=%i|%N"])
        rows = [line.split("|", 1) for line in out.splitlines() if line.strip()]
        return [(r[0].strip(), (r[1] if len(r) > 1 else "").strip()) for r in rows]

    def hostnames(self, nodelist: str) -> tuple[str, ...]:
        """The node names of a compressed list (``node[0,2]`` -> node0, node2), in Slurm's
        order (``scontrol show hostnames``); () for ""."""
        if not nodelist:
            return ()
        out = self(["scontrol", "show", "hostnames", nodelist])
        return tuple(h.strip() for h in out.splitlines() if h.strip())

    def jobs_named(self, name: str) -> list[SlurmJobInfo]:
        """Every job slurmctld still knows whose ``JobName`` is ``name``, oldest first
        (:meth:`jobs`; finished jobs stay ``MinJobAge`` seconds, 300 by default)."""
        found = [job for job in self.jobs() if job.name == name]
        return sorted(found, key=lambda job: int(job.job_id) if job.job_id.isdigit() else 0)

    def submit(self, args: Sequence[str]) -> str:
        """``sbatch --parsable ARGS``; returns the new job's id."""
        out = self(["sbatch", "--parsable", *args]).strip()
        # --parsable prints "<jobid>" or "<jobid>;<cluster>".
        return out.split(";", 1)[0]

    def requeue(self, job_id: str) -> None:
        """``scontrol requeue <job_id>`` (a batch job submitted with ``--requeue``)."""
        self(["scontrol", "requeue", job_id])

    def update_job(self, job_id: str, **fields: str) -> None:
        """``scontrol update JobId=<job_id> Key=value ...`` (``StartTime="now"``,
        ``ExcNodeList="node1"``; most fields only while the job is PENDING)."""
        self(["scontrol", "update", f"JobId={job_id}", *(f"{k}={v}" for k, v in fields.items())])

    def update_node(self, node: str, state: str, reason: str | None = None) -> None:
        """``scontrol update NodeName=<node> State=<state> [Reason=<reason>]`` (``DRAIN``
        needs a reason; ``RESUME`` returns a drained or DOWN node to service)."""
        argv = ["scontrol", "update", f"NodeName={node}", f"State={state}"]
        self([*argv, f"Reason={reason}"] if reason is not None else argv)

    def job_details(self, job_id: str) -> str:
        """``scontrol --details show job <job_id>`` as printed (diagnostics)."""
        return self(["scontrol", "--details", "show", "job", job_id])

    def node_details(self, nodes: Sequence[str]) -> str:
        """``scontrol show node <a,b>`` as printed (diagnostics)."""
        return self(["scontrol", "show", "node", ",".join(nodes)]) if nodes else ""

    def step_ids(self, job_id: str) -> list[str]:
        """The job's running steps' ids (``<id>.batch``, ``<id>.0`` ...; ``squeue --steps``)."""
        out = self(["squeue", "--noheader", "--steps", f"--jobs={job_id}", "--format=%i"])
        return [line.strip() for line in out.splitlines() if line.strip()]

    def steps(self, job_id: str) -> str:
        """``squeue --steps --jobs=<job_id>`` as printed (diagnostics; never address a step
        by its number: a background ``srun`` races the training one for it)."""
        return self(["squeue", "--steps", f"--jobs={job_id}"])


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

    @property
    def reason_text(self) -> str | None:
        """:attr:`reason` without Slurm's ``[user@time]`` suffix."""
        return None if self.reason is None else _REASON_STAMP.sub("", self.reason) or None

    @property
    def reason_time(self) -> float | None:
        """When the reason was set (Unix s), from Slurm's ``[user@time]`` suffix; None
        without one."""
        found = _REASON_STAMP.search(self.reason or "")
        return slurm_time(found.group(1)) if found else None


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
        restarts: ``Restarts``: how often it was requeued.
        submit_time: ``SubmitTime`` (Unix s): the submission, or the last requeue (Slurm
            sets it again on requeue).
        start_time: ``StartTime`` (Unix s): the current run's start; while PENDING the
            expected start (``BeginTime`` after a requeue). None: ``Unknown``.
        end_time: ``EndTime`` (Unix s), None while running.
        excluded: ``ExcNodeList`` (compressed), "" for none.
    """

    job_id: str
    name: str
    state: str
    nodes: str
    reason: str | None
    exit_code: str
    restarts: int = 0
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    excluded: str = ""

    @classmethod
    def of(cls, record: Mapping[str, str]) -> SlurmJobInfo:
        reason = record.get("Reason", "None")
        restarts = record.get("Restarts", "0")
        return cls(
            job_id=record["JobId"],
            name=record.get("JobName", ""),
            state=record.get("JobState", ""),
            nodes=_listed(record.get("NodeList", "")),
            reason=None if reason == "None" else reason,
            exit_code=record.get("ExitCode", ""),
            restarts=int(restarts) if restarts.isdigit() else 0,
            submit_time=slurm_time(record.get("SubmitTime", "")),
            start_time=slurm_time(record.get("StartTime", "")),
            end_time=slurm_time(record.get("EndTime", "")),
            excluded=_listed(record.get("ExcNodeList", "")),
        )


def _listed(nodes: str) -> str:
    return "" if nodes == "(null)" else nodes


def slurm_time(text: str) -> float | None:
    """Unix seconds of a Slurm time stamp (``2026-12-02T03:29:59``, the controller's local
    time, read in this process's time zone); None for ``Unknown``, ``None``, ``N/A`` or ""."""
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class SlurmJob:
    """A running Slurm job: its id and its nodes, in node-rank order."""

    job_id: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class SlurmBackend:
    """The Slurm backend (module docstring); every action reads its effect back.

    Attributes:
        diagnostics_dir: where ``collect_diagnostics`` writes (created on demand).
        nproc_per_node: torchrun ``--nproc-per-node`` of the recipe (ranks per node).
        control_dir: the trainer's control directory on the shared filesystem, with
            ``{job}``/``{jobid}`` placeholders; None: ``request_checkpoint`` raises.
        commands: the Slurm command client (default: the environment's ``slurm.conf``).
        wait: how long and how often an action reads Slurm back (:class:`SlurmWait`).
        clock: Unix time source (seconds), for the control file and diagnostics.
        stop: how a requeue confirms the old run gone (:class:`SlurmStop`, :mod:`.stopping`).
    """

    diagnostics_dir: Path
    nproc_per_node: int = 1
    control_dir: str | None = None
    commands: SlurmCommands = field(default_factory=SlurmCommands)
    wait: SlurmWait = field(default_factory=SlurmWait)
    clock: Callable[[], float] = field(default=time.time)
    stop: SlurmStop = field(default_factory=SlurmStop)

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise BackendError(f"nproc_per_node: must be >= 1 (got {self.nproc_per_node})")

    def find(self, job: str) -> SlurmJob:
        """The running Slurm job named ``job`` (its id; then addressed by id only).

        Raises:
            BackendError: none (or more than one) is running, or a command failed.
        """
        rows = self.commands.running_jobs(job)
        if not rows:
            raise BackendError(f"no live worker of job {job!r} found (no running Slurm job)")
        if len(rows) > 1:
            ids = ", ".join(r[0] for r in rows)
            raise BackendError(f"job {job!r}: several running Slurm jobs ({ids}); name one")
        job_id, nodelist = rows[0]
        return SlurmJob(job_id, self.commands.hostnames(nodelist))

    def ranks(self, job: str) -> dict[int, str]:
        """Global rank -> node (node ``i`` of the allocation holds ranks ``i*nproc..``)."""
        nproc = self.nproc_per_node
        found = self.find(job)
        return {i * nproc + r: node for i, node in enumerate(found.nodes) for r in range(nproc)}

    def restart_workers(self, job: str) -> str:
        """Requeue the job and start it at once; read back RUNNING again (a restart more).

        Raises:
            BackendError: no running job, a command failed, the old run was not confirmed
                gone (NotStopped) or the job not RUNNING again within the wait.
        """
        found = self.find(job)
        started = self.wait.clock()
        running = requeue_and_start(self.commands, self.wait, found.job_id, stop=self.stop)
        return (
            f"requeued Slurm job {found.job_id} ({job}): RUNNING again on {running.nodes} "
            f"(restart {running.restarts}) after {self.wait.elapsed_since(started):.1f} s"
        )

    def exclude_node_and_restart(self, job: str, node: str) -> str:
        """Drain ``node`` with a reason (read back), requeue the job with ``node`` in its
        ``ExcNodeList`` and start it at once; read back RUNNING on nodes without ``node``.

        Raises:
            BackendError: ``node`` is not the job's, a command failed, or an effect did
                not show within the wait (the state seen in the message).
        """
        found = self.find(job)
        if node not in found.nodes:
            raise BackendError(f"job {job!r} has no live worker on node {node!r}")
        started = self.wait.clock()
        reason = f"stormwatch: excluded from job {job} ({found.job_id})"
        self.commands.update_node(node, "DRAIN", reason=reason)
        self.wait.node(
            self.commands,
            node,
            lambda n: drained(n) and n.reason_text == reason,
            f"drained with reason {reason!r}",
        )
        running = requeue_and_start(self.commands, self.wait, found.job_id, node, self.stop)
        return (
            f"drained {node} and requeued Slurm job {found.job_id} ({job}): RUNNING on "
            f"{running.nodes} without {node} after {self.wait.elapsed_since(started):.1f} s"
        )

    def resume_node(self, node: str) -> str:
        """``scontrol update NodeName=<node> State=RESUME`` (after a partition heals or a
        drain), read back until slurmctld hears from it: IDLE/MIXED/ALLOCATED with no
        DRAIN or NOT_RESPONDING flag.

        Raises:
            BackendError: Slurm refused, or the node was not back within the wait.
        """
        started = self.wait.clock()
        self.commands.update_node(node, "RESUME")
        back = self.wait.node(self.commands, node, in_service, "back in service")
        return f"resumed {node}: {back.state} after {self.wait.elapsed_since(started):.1f} s"

    def request_checkpoint(self, job: str) -> str:
        """Arm ``checkpoint_now`` in rank 0's control file (:func:`~.base.control_dir_for`)."""
        found = self.find(job)
        if self.control_dir is None:
            raise BackendError(
                "checkpoint_now on slurm needs the trainer's control directory on the shared "
                "filesystem (platform setting control_dir, e.g. /shared/{job}/control)"
            )
        folder = control_dir_for(self.control_dir, job=job, job_id=found.job_id, nodes=found.nodes)
        return request_checkpoint_in(folder / "rank0.json", job, self.clock())

    def collect_diagnostics(self, job: str, incident_id: int) -> str:
        """Write the job (``scontrol --details show job``), its nodes (``scontrol show
        node``) and its steps (``squeue --steps``) to ``incident-<id>.json``."""
        found = self.find(job)
        info = self.commands.job(found.job_id)
        report = {
            "job": job,
            "platform": "slurm",
            "time": self.clock(),
            "job_id": found.job_id,
            "nodes": list(found.nodes),
            "job_state": dataclasses.asdict(info),
            "scontrol_show_job": self.commands.job_details(found.job_id),
            "scontrol_show_node": self.commands.node_details(found.nodes),
            "steps": self.commands.steps(found.job_id),
        }
        path = write_diagnostics(self.diagnostics_dir, incident_id, report)
        return f"diagnostics of Slurm job {found.job_id} ({job}) in {path}"


__all__ = [
    "ACTIVE_STATES",
    "COMMAND_TIMEOUT_S",
    "CommandRunner",
    "SlurmBackend",
    "SlurmCommands",
    "SlurmJob",
    "SlurmJobInfo",
    "SlurmNodeInfo",
    "parse_oneliner",
    "run_command",
    "slurm_time",
]
