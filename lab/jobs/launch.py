"""Starting, watching and stopping a lab job: one torchrun per node namespace.

:func:`start` launches every node's torchrun (:mod:`.torchrun`: its command line and
environment) under its own rendezvous port; :func:`wait`, :func:`result` and
:func:`stranded` follow it; :func:`stop` ends it. For elastic jobs :func:`leave` stops one
node gracefully, :func:`rejoin` starts a lost node again and :func:`relaunch_closed` is
FC-09's remedy (:mod:`.elastic`).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from stormwatch.contracts.rank_env import JOB_INSTANCE_ENV
from stormwatch.lab.config import JobSpec
from stormwatch.lab.errors import JobError, JobTimeoutError
from stormwatch.lab.jobs import slurmjob
from stormwatch.lab.jobs.elastic import (
    MAX_RELAUNCHES,
    check_elastic,
    log_tail,
    port_conflicted,
    rendezvous_closed,
)
from stormwatch.lab.jobs.torchrun import job_environment, torchrun_command
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.services import procs
from stormwatch.lab.state import JobInfo, JobRecord, JobResult, LabState
from stormwatch.ports import Backoff, says_port_conflict

#: Seconds between two looks at a running job's status files.
POLL_INTERVAL = 0.5


#: How many ports above ``LabConfig.rdzv_port`` are tried for a job's rendezvous.
RDZV_PORT_RANGE = 100


def listening_ports(netns: str) -> set[int]:
    """TCP ports with a listening socket in network namespace ``netns`` (``/proc/net/tcp*``
    read from inside it); empty when it cannot be read."""
    try:
        out = subprocess.run(
            ["ip", "netns", "exec", netns, "cat", "/proc/net/tcp", "/proc/net/tcp6"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    ports: set[int] = set()
    for line in out.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A" and ":" in fields[1]:  # 0A: LISTEN
            with contextlib.suppress(ValueError):  # not a port: a line of another format
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def allocate_rdzv_port(state: LabState) -> int:
    """A rendezvous port for a new job: ``LabConfig.rdzv_port`` or the next one that no
    running job of the lab holds and nothing listens on in node 0's namespace.

    Raises:
        JobError: none free within :data:`RDZV_PORT_RANGE` ports.
    """
    base = state.config.rdzv_port
    taken = {record.info.rdzv_port or base for record in state.jobs.values() if is_running(record)}
    taken |= listening_ports(state.nodes[0].netns)
    taken.add(state.config.agent_port)
    for port in range(base, min(base + RDZV_PORT_RANGE, 65536)):
        if port not in taken:
            return port
    raise JobError(
        f"no free rendezvous port in {base}-{base + RDZV_PORT_RANGE - 1} on "
        f"{state.nodes[0].name}: stop a job (`stormwatch lab stop --job NAME`)"
    )


def start(state: LabState, spec: JobSpec, paths: RunPaths, base_env: dict[str, str]) -> JobRecord:
    """Start one torchrun on each of the job's nodes (node 0 first) and return its record.

    The job gets its own rendezvous port (:func:`allocate_rdzv_port`, recorded in
    ``JobInfo.rdzv_port``), so jobs can run side by side.

    The processes are recorded in the returned record; if a later node cannot be
    started, the earlier ones are stopped before :class:`JobError` is raised.

    With the lab's scheduler ``slurm`` a fixed-size ``stormwatch train`` job is submitted
    with ``sbatch`` instead (:mod:`.slurmjob`); the functions below follow it through Slurm.
    """
    if slurmjob.uses_slurm(state, spec):
        return slurmjob.start(state, spec, paths, base_env, allocate_rdzv_port(state))
    check_elastic(state, spec)
    for folder in (paths.job_logs(spec.name), paths.job_checkpoints(spec.name)):
        folder.mkdir(parents=True, exist_ok=True)
    for node in state.nodes:
        node.metrics_dir.mkdir(parents=True, exist_ok=True)
    record = JobRecord(info=JobInfo.new(paths, spec, allocate_rdzv_port(state)))
    try:
        for rank in range(spec.node_count(state.config)):
            _launch_node(state, record, rank, paths, base_env)
    except BaseException as exc:  # Ctrl-C included: leave no half-started job behind
        stop(record)
        if isinstance(exc, Exception):
            raise JobError(f"could not start job {spec.name!r}: {exc}") from exc
        raise
    return record


def _launch_node(
    state: LabState,
    record: JobRecord,
    rank: int,
    paths: RunPaths,
    base_env: dict[str, str],
    rdzv_id: str | None = None,
) -> None:
    spec = record.info.spec
    node = state.nodes[rank]
    process = procs.launch(
        f"{spec.name}/{node.name}",
        torchrun_command(state, spec, rank, paths, record.info.rdzv_port, rdzv_id),
        log_file=paths.job_node_log(spec.name, node.name),
        status_file=paths.job_node_status(spec.name, node.name),
        # One start of the job: rejoins and relaunches (a fresh rendezvous id) keep it, so
        # the node agents keep the job's folded counters (stormwatch.agent.watch.folder).
        env={
            **job_environment(spec, node, base_env, paths),
            JOB_INSTANCE_ENV: f"{spec.name}@{record.info.started_at:.6f}",
        },
        netns=node.netns,
        cwd=paths.job_dir(spec.name),
    )
    record.processes[node.name] = process
    record.info.node_pids[node.name] = process.pid
    record.info.node_logs[node.name] = process.log_file


def rejoin(
    state: LabState, record: JobRecord, node_name: str, paths: RunPaths, base_env: dict[str, str]
) -> None:
    """Start node ``node_name``'s torchrun again in a running elastic job (it joins the
    rendezvous as a new node; the running agents restart the group at the larger size).

    Raises:
        JobError: the job is not elastic or no longer runs, the node is unknown, or its
            torchrun still runs.
    """
    spec = record.info.spec
    names = [node.name for node in state.nodes[: spec.node_count(state.config)]]
    if spec.min_nodes is None:
        raise JobError(
            f"job {spec.name!r} has a fixed size; start it with --min-nodes to let nodes rejoin"
        )
    if node_name not in names:
        raise JobError(f"no node {node_name!r} in job {spec.name!r}; nodes: {', '.join(names)}")
    current = record.processes.get(node_name)
    if current is not None and not procs.is_finished(current):
        raise JobError(f"the torchrun of {node_name} in job {spec.name!r} is still running")
    if not is_running(record):
        raise JobError(f"job {spec.name!r} has ended; start it again instead")
    _launch_node(state, record, names.index(node_name), paths, base_env)


def leave(record: JobRecord, node_name: str, grace: float) -> int | None:
    """Node ``node_name`` leaves the running elastic job gracefully, as an operator draining
    it would: SIGTERM to its torchrun alone, which stops its workers (SIGTERM) and exits; the
    other nodes' agents restart the worker group at the smaller size from the last checkpoint
    (docs/ARCHITECTURE.md "Elastic resize"). What is left of the node's processes after
    ``grace`` seconds is SIGKILLed; :func:`rejoin` brings the node back.

    Returns:
        The node's torchrun exit status as its supervisor recorded it (``None``: unknown).

    Raises:
        JobError: the job is not elastic or no longer runs, the node is not one of its
            nodes, hosts its rendezvous (node 0: the job would end), or is not running; or a
            process of the node is still running after SIGKILL.
    """
    spec = record.info.spec
    names = list(record.processes)
    if spec.min_nodes is None:
        raise JobError(f"job {spec.name!r} has a fixed size: a node leaving would end it")
    if node_name not in names:
        raise JobError(f"no node {node_name!r} in job {spec.name!r}; nodes: {', '.join(names)}")
    if node_name == names[0]:
        raise JobError(
            f"{node_name} hosts the rendezvous of job {spec.name!r}: the job would end with it; "
            f"let another node leave ({', '.join(names[1:]) or 'none'})"
        )
    process = record.processes[node_name]
    torchrun = [p for p in procs.tree(process) if p.pid == process.pid]
    if not torchrun:
        raise JobError(f"the torchrun of {node_name} in job {spec.name!r} is not running")
    with contextlib.suppress(psutil.Error):  # gone meanwhile: it left already
        torchrun[0].terminate()
    deadline = time.monotonic() + grace
    while procs.is_running(process) and time.monotonic() < deadline:
        time.sleep(0.1)
    # The torchrun and its workers, not the supervisor: it records the exit status.
    rest = [p for p in procs.tree(process) if p.pid != process.supervisor_pid]
    left = procs.terminate(rest, grace=0.0)
    if left:
        raise JobError(f"job {spec.name!r}: {', '.join(left)} of {node_name} survived SIGKILL")
    deadline = time.monotonic() + 10.0  # the supervisor records the exit status, then exits
    while not procs.is_finished(process) and time.monotonic() < deadline:
        time.sleep(0.1)
    return procs.exit_status(process).returncode


def relaunch_closed(
    state: LabState, record: JobRecord, paths: RunPaths, base_env: dict[str, str]
) -> bool:
    """FC-09 remedy, and a port conflict's: when a node's torchrun ended with
    ``RendezvousClosedError``, or because its rendezvous port was in use
    (:func:`~.elastic.port_conflicted`), stop the rest, wait until every process of the job
    is gone (:func:`stop` confirms it, so no old process still holds a port), and start
    every node again under a fresh rendezvous id (``<job>-r<N>``); after a port conflict
    on a fresh rendezvous port, after :class:`~stormwatch.ports.Backoff`'s wait. The
    trainer resumes from the last complete checkpoint.

    Returns:
        True if the job was relaunched; False when neither happened, or after
        :data:`MAX_RELAUNCHES` relaunches (the job then fails as it is).
    """
    conflict = bool(port_conflicted(record))
    if record.info.relaunches >= MAX_RELAUNCHES:
        return False
    if not (conflict or rendezvous_closed(record)):
        return False
    stop(record, grace=state.config.grace_period_s)  # raises unless every process is gone
    if conflict:
        delays = Backoff(attempts=MAX_RELAUNCHES + 1).delays()
        time.sleep(delays[min(record.info.relaunches, len(delays) - 1)])
        record.info.rdzv_port = allocate_rdzv_port(state)
    record.info.relaunches += 1
    rdzv_id = f"{record.info.name}-r{record.info.relaunches}"
    for rank in range(record.info.spec.node_count(state.config)):
        _launch_node(state, record, rank, paths, base_env, rdzv_id)
    return True


def is_running(record: JobRecord) -> bool:
    """Whether any node of the job still runs (its supervisor included); for a Slurm job,
    whether Slurm still holds it."""
    if record.info.slurm_job_id is not None:
        return slurmjob.is_running(record)
    return any(not procs.is_finished(p) for p in record.processes.values())


def result(record: JobRecord) -> JobResult:
    """Exit codes as recorded so far (``None`` for nodes still running or lost).

    A fixed-size job is ``ok`` when every node's torchrun exited with 0. An
    elastic job (``JobSpec.min_nodes``) is ``ok`` when none still runs and at
    least ``min_nodes`` of them finished with 0: the survivors completed the
    training without the lost nodes, which ``detail`` still names.
    """
    if record.info.slurm_job_id is not None:
        return slurmjob.result(record)
    codes = {node: procs.exit_status(p).returncode for node, p in record.processes.items()}
    min_nodes = record.info.spec.min_nodes
    finished = sum(1 for code in codes.values() if code == 0)
    if min_nodes is None:
        ok = bool(codes) and finished == len(codes)
    else:
        running = any(not procs.is_finished(p) for p in record.processes.values())
        ok = not running and finished >= max(min_nodes, 1)
    detail = None
    failed = [node for node, code in codes.items() if code not in (None, 0)]
    if failed:
        detail = "; ".join(
            f"{node} (exit {codes[node]}): "
            + (" | ".join(failure_lines(record.processes[node].log_file)) or "no output")
            + f" [{record.processes[node].log_file}]"
            for node in failed
        )
        if ok:
            detail = f"elastic job finished on {finished} of {len(codes)} nodes; lost: {detail}"
    return JobResult(name=record.info.name, ok=ok, exit_codes=codes, detail=detail)


def stranded(record: JobRecord) -> str | None:
    """Why a running job can never finish, or ``None``.

    It cannot when a node's torchrun has exited (failed, or its supervisor is
    gone) while another node's still runs: the survivors wait for a world that
    will never be whole again.
    """
    if record.info.slurm_job_id is not None:
        return None  # Slurm ends the job when a node's torchrun fails (--kill-on-bad-exit)
    gone = {node: p for node, p in record.processes.items() if procs.is_finished(p)}
    waiting = sorted(set(record.processes) - set(gone))
    codes = {node: procs.exit_status(p).returncode for node, p in gone.items()}
    lost = sorted(node for node, code in codes.items() if code != 0)
    if not waiting or not lost:
        return None
    min_nodes = record.info.spec.min_nodes
    if min_nodes is not None and len(waiting) >= min_nodes and not rendezvous_closed(record):
        return None  # elastic: the survivors go on at a smaller size
    exits = ", ".join(f"{node} (exit {codes[node]})" for node in lost)
    return (
        f"cannot finish: the torchrun of {exits} is gone while {', '.join(waiting)} still "
        f"wait(s); stop it with `stormwatch lab stop --job {record.info.name}`"
    )


#: Lines of a torchrun log that say why it failed: exception lines (``ValueError: boom``,
#: ``torch.distributed.DistNetworkError: ... EADDRINUSE``), glog-style ERROR lines
#: (``E1130 12:52:00.183 ... failed (exitcode: 3)``), socket errors.
_MEANINGFUL = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b:?\s*\S|^E\d{4} ")


def failure_lines(log_file: Path, limit: int = 3, tail_bytes: int = 65536) -> list[str]:
    """The last ``limit`` meaningful lines (errors, exceptions) of a torchrun log; its last
    non-empty lines when none match; empty when the file cannot be read."""
    text = log_tail(log_file, tail_bytes)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    meaningful = [line for line in lines if _MEANINGFUL.search(line) or says_port_conflict(line)]
    meaningful = [line for i, line in enumerate(meaningful) if line not in meaningful[:i]]
    chosen = (meaningful or lines)[-limit:]
    return [line[:300] for line in chosen]


def wait(
    record: JobRecord,
    timeout: float,
    relaunch: Callable[[], JobRecord | None] | None = None,
) -> JobResult:
    """Block until every node's torchrun (and its supervisor) has exited.

    Args:
        relaunch: called when a node's torchrun ended with ``RendezvousClosedError``
            (FC-09); returns the relaunched job's record (waiting goes on with it) or
            ``None`` (e.g. :func:`relaunch_closed`'s budget is spent).

    Raises:
        JobTimeoutError: after ``timeout`` seconds, naming the nodes still running.
    """
    if record.info.slurm_job_id is not None:
        return slurmjob.wait(record, timeout)
    deadline = time.monotonic() + timeout
    while True:
        if relaunch is not None and (rendezvous_closed(record) or port_conflicted(record)):
            fresh = relaunch()
            if fresh is not None:
                record = fresh
                continue
        running = [n for n, p in record.processes.items() if not procs.is_finished(p)]
        if not running:
            return result(record)
        if time.monotonic() >= deadline:
            raise JobTimeoutError(
                f"job {record.info.name!r} still running on {', '.join(running)} after "
                f"{timeout:.0f} s; see {record.info.job_dir}/<node>.torchrun.log"
            )
        time.sleep(POLL_INTERVAL)


def stop(record: JobRecord, grace: float = 10.0) -> JobResult:
    """SIGTERM every node's torchrun and workers, SIGKILL after ``grace`` seconds, confirm
    every one gone (:mod:`stormwatch.platforms.stopping`), then report.

    Raises:
        JobError: a process of the job is still running after SIGKILL.
    """
    if record.info.slurm_job_id is not None:
        return slurmjob.stop(record, grace)
    victims = [proc for p in record.processes.values() for proc in procs.tree(p)]
    left = procs.terminate(victims, grace=grace)
    if left:
        raise JobError(f"job {record.info.name!r}: {', '.join(left)} still running after SIGKILL")
    # The supervisors write the exit status right after their command is gone.
    deadline = time.monotonic() + 10.0
    while is_running(record) and time.monotonic() < deadline:
        time.sleep(0.1)
    return result(record)


__all__ = [
    "POLL_INTERVAL",
    "RDZV_PORT_RANGE",
    "allocate_rdzv_port",
    "failure_lines",
    "is_running",
    "leave",
    "listening_ports",
    "rejoin",
    "relaunch_closed",
    "result",
    "start",
    "stop",
    "stranded",
    "wait",
]
