"""Slurm's job state transitions and node drain reasons, as typed events for post-mortems.

Two readers, both through :class:`~stormwatch.platforms.slurm.SlurmCommands`:

* :func:`read_slurm_history`: what one reading of ``scontrol show job`` / ``show node``
  still tells afterwards: each job of that name was submitted (``SubmitTime``) or, once
  requeued, requeued (Slurm sets ``SubmitTime`` again on requeue; ``Restarts`` counts
  them), started on its nodes (``StartTime``, ``NodeList``), ended (``EndTime``), with
  its ``ExcNodeList``; and each node drained or down with its reason (``Reason=<why>
  [<user>@<time>]``). The incident post-mortem merges these into its timeline
  (``stormwatch.alerts.incident_report``). Slurm forgets a finished job ``MinJobAge``
  (300 s by default) after it ended; the moments between two requeues are not kept.
* :class:`SlurmRecorder`: a poller; each :meth:`~SlurmRecorder.sample` reads the job and
  the nodes and returns what changed since the last one (PENDING with its reason,
  RUNNING on which nodes, a requeue, a node drained, resumed), so every transition is
  seen when it is sampled often enough.

Times are Unix seconds; Slurm prints the controller's local time, read in this
process's time zone (:func:`~stormwatch.platforms.slurm.slurm_time`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from stormwatch.platforms.slurm import SlurmCommands, SlurmJobInfo, SlurmNodeInfo

#: Job states after which the job has an ``EndTime`` worth a line.
ENDED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
)


@dataclass(frozen=True)
class SlurmEvent:
    """One moment of Slurm's state.

    Attributes:
        at: Unix seconds.
        subject: ``job <id> (<name>)`` or ``node <name>``.
        event: what happened, in words (``requeued (restart 1)``, ``RUNNING on
            node[0,2]``, ``drained``).
        detail: Slurm's own fields behind it (``Reason=...``, ``ExcNodeList=...``).
    """

    at: float
    subject: str
    event: str
    detail: str = ""


@dataclass(frozen=True)
class SlurmHistory:
    """What :func:`read_slurm_history` found: events by time, and what was read (in words)."""

    events: list[SlurmEvent]
    what: str


def _job_subject(info: SlurmJobInfo) -> str:
    return f"job {info.job_id} ({info.name})"


def _job_detail(info: SlurmJobInfo) -> str:
    parts = [f"Reason={info.reason}" if info.reason else "", f"Restarts={info.restarts}"]
    parts.append(f"ExcNodeList={info.excluded}" if info.excluded else "")
    return " ".join(p for p in parts if p)


def job_events(info: SlurmJobInfo) -> list[SlurmEvent]:
    """What one ``scontrol show job`` record tells: submitted or requeued, started, ended."""
    subject, detail = _job_subject(info), _job_detail(info)
    events = []
    if info.submit_time is not None:
        what = f"requeued (restart {info.restarts})" if info.restarts else "submitted"
        events.append(SlurmEvent(info.submit_time, subject, what, detail))
    if info.start_time is not None and info.state != "PENDING" and info.nodes:
        events.append(SlurmEvent(info.start_time, subject, f"started on {info.nodes}", detail))
    if info.end_time is not None and info.state in ENDED_STATES:
        what = f"ended {info.state} (exit {info.exit_code})"
        events.append(SlurmEvent(info.end_time, subject, what, detail))
    return events


def node_events(nodes: Iterable[SlurmNodeInfo]) -> list[SlurmEvent]:
    """Each node with a reason and its time: ``drained``/``down``/... with that reason."""
    events = []
    for node in nodes:
        if node.reason_time is None:
            continue
        what = "drained" if "DRAIN" in node.flags else f"{node.base_state.lower()}"
        detail = f"State={node.state} Reason={node.reason_text}"
        events.append(SlurmEvent(node.reason_time, f"node {node.name}", what, detail))
    return events


def read_slurm_history(commands: SlurmCommands, job: str) -> SlurmHistory:
    """Events of every job named ``job`` slurmctld still knows and of every node with a
    drain/down reason, by time.

    Raises:
        BackendError: Slurm cannot be read (the caller decides whether that matters).
    """
    jobs = [info for info in commands.jobs() if info.name == job]
    nodes = list(commands.nodes().values())
    events = [e for info in jobs for e in job_events(info)] + node_events(nodes)
    events.sort(key=lambda e: e.at)
    reasons = sum(1 for n in nodes if n.reason)
    ids = ", ".join(info.job_id for info in jobs) or "none"
    what = (
        f"scontrol show job/node: Slurm jobs named {job!r}: job id(s) {ids}; "
        f"{reasons} of {len(nodes)} nodes with a reason"
    )
    return SlurmHistory(events, what)


@dataclass
class SlurmRecorder:
    """Samples one job (by id) and every node; returns what changed since the last sample.

    Attributes:
        commands: the Slurm command client.
        job_id: the job followed.
        clock: Unix time of a sample (the time of its events).
        events: every event returned so far, in order.
    """

    commands: SlurmCommands
    job_id: str
    clock: Callable[[], float] = field(default=time.time)
    events: list[SlurmEvent] = field(default_factory=list)
    _job: SlurmJobInfo | None = field(default=None, init=False, repr=False)
    _nodes: dict[str, SlurmNodeInfo] = field(default_factory=dict, init=False, repr=False)

    def sample(self) -> list[SlurmEvent]:
        """Read the job and the nodes once; the changes as events (also kept in :attr:`events`).

        Raises:
            BackendError: Slurm cannot be read, or it forgot the job.
        """
        now = self.clock()
        job, nodes = self.commands.job(self.job_id), self.commands.nodes()
        new = self._job_changes(now, job) + self._node_changes(now, nodes)
        self._job, self._nodes = job, nodes
        self.events += new
        return new

    def _job_changes(self, now: float, job: SlurmJobInfo) -> list[SlurmEvent]:
        before, subject, detail = self._job, _job_subject(job), _job_detail(job)
        new = []
        if before is not None and job.restarts > before.restarts:
            new.append(SlurmEvent(now, subject, f"requeued (restart {job.restarts})", detail))
        if before is None or (job.state, job.reason, job.nodes) != (
            before.state,
            before.reason,
            before.nodes,
        ):
            where = f" on {job.nodes}" if job.nodes else ""
            new.append(SlurmEvent(now, subject, f"{job.state}{where}", detail))
        return new

    def _node_changes(self, now: float, nodes: Mapping[str, SlurmNodeInfo]) -> list[SlurmEvent]:
        new = []
        for name, node in sorted(nodes.items()):
            before = self._nodes.get(name)
            if before is not None and (before.state, before.reason) == (node.state, node.reason):
                continue
            if before is None and node.reason is None:
                continue  # first sample: only nodes already drained or down are news
            detail = f"State={node.state}" + (f" Reason={node.reason_text}" if node.reason else "")
            new.append(SlurmEvent(now, f"node {name}", f"state {node.state}", detail))
        return new


__all__ = [
    "ENDED_STATES",
    "SlurmEvent",
    "SlurmHistory",
    "SlurmRecorder",
    "job_events",
    "node_events",
    "read_slurm_history",
]
