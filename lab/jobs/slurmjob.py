"""Lab jobs through Slurm: ``sbatch`` of the recipe a user submits, deploy/slurm/train.sbatch.

The lab passes its settings through the environment (``sbatch`` exports the submitter's
environment to the job; the recipe's settings, docs/deploy-slurm.md):

* ``STORMWATCH_SITE_AGENT=1``: the lab runs a site-wide agent per node already, so the
  recipe starts no agent step and writes no file_sd list;
* ``STORMWATCH_SHARED`` = the job's lab folder (rank logs in ``<job>/logs``, checkpoints in
  ``<job>/checkpoints``);
* ``STORMWATCH_METRICS_DIR`` / ``STORMWATCH_CONTROL_DIR`` = that node's agent metrics folder
  (``<run>/nodes/%n/metrics``, ``%n`` = the Slurm node name, which is the lab node name);
* ``STORMWATCH_VENV`` (this interpreter's environment), ``STORMWATCH_MAX_RESTARTS``
  (``JobSpec.max_restarts``: torchrun restarts the workers in place, c10d rendezvous on the
  first node's address), ``STORMWATCH_RDZV_PORT``, ``STORMWATCH_TORCHRUN_LOG``
  (``<job>/<node>.torchrun.log``), ``TRAIN_ARGS`` (:func:`~.torchrun.trainer_options`), or
  for a job with a ``command`` ``STORMWATCH_COMMAND`` (the command, shell-quoted: the recipe
  runs it instead of ``stormwatch train`` and exports the job's folders to it);
* ``GLOO_SOCKET_IFNAME``, ``OMP_NUM_THREADS``, ``PET_MONITOR_INTERVAL`` (torchrun's
  ``--monitor-interval``) and ``JobSpec.env``.

``sbatch`` options override the recipe's header for the lab's shape: ``--nodes``,
``--gpus-per-node`` (``nproc_per_node``: the recipe's NPROC), ``--cpus-per-task=1``.
``srun`` starts one torchrun per node inside that node's namespace (slurmd runs there).
Job control is Slurm's: the job is found by id (recorded in ``JobInfo.slurm_job_id``; by
name with :meth:`SlurmCommands.jobs_named`), its state read with ``scontrol``, cancelled with
``scancel``. Steps are never addressed by number (a background step and the training step
race for numbers, issue 15).

Exit codes per node come from Slurm and the rank logs: Slurm without accounting keeps no
per-task status, so a node whose every rank logged ``done`` in its last attempt is 0 and
the others get the job's exit status (``-signal`` when a signal ended it).
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path

import psutil

from stormwatch.lab.config import JobSpec
from stormwatch.lab.errors import JobError, JobTimeoutError
from stormwatch.lab.jobs.elastic import check_elastic
from stormwatch.lab.jobs.torchrun import MONITOR_INTERVAL, trainer_options
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import JobInfo, JobRecord, JobResult, LabState
from stormwatch.platforms.errors import BackendError, NotStopped
from stormwatch.platforms.lab_slurm import stop_slurm_job_leftovers
from stormwatch.platforms.slurm import ACTIVE_STATES, SlurmCommands
from stormwatch.telemetry.ranklogs import read_job_logs

log = logging.getLogger(__name__)

#: The recipe (the repository's deploy/slurm/train.sbatch, next to the installed package).
RECIPE = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "train.sbatch"
#: Slurm job states in which the job still holds (or will hold) nodes (the platform's).
ACTIVE = ACTIVE_STATES
#: Seconds ``start`` waits for RUNNING and then for every node's torchrun (measured: under
#: a second to RUNNING on the lab machine, issue 15).
START_TIMEOUT_S = 60.0
#: Seconds one Slurm read of the lab may take (a dead slurmctld must not hold ``lab down``).
READ_TIMEOUT_S = 10.0
#: Seconds beyond the grace period (``KillWait``) a cancelled job may stay COMPLETING:
#: slurmd's kill, its epilog and its message to slurmctld (well under a second on the lab).
STOP_MARGIN_S = 10.0


def uses_slurm(state: LabState, spec: JobSpec) -> bool:
    """Whether ``spec`` is submitted through Slurm: the lab's scheduler is ``slurm``, its
    cluster runs, and the job is neither elastic nor a smoke test's ``entrypoint`` (those
    start directly: the recipe runs a fixed-size job; a ``command`` is run by it too)."""
    return (
        state.config.job_scheduler == "slurm"
        and state.slurm is not None
        and spec.min_nodes is None
        and spec.entrypoint is None
    )


def commands(record: JobRecord) -> SlurmCommands:
    """The Slurm client of the lab the job was submitted to."""
    return SlurmCommands(conf=record.info.slurm_conf, timeout_s=READ_TIMEOUT_S)


def environment(
    state: LabState, spec: JobSpec, paths: RunPaths, base_env: dict[str, str], rdzv_port: int
) -> dict[str, str]:
    """The environment ``sbatch`` exports to the recipe (module docstring)."""
    job_dir = paths.job_dir(spec.name)
    metrics = paths.node_metrics("%n")
    return {
        **base_env,
        "STORMWATCH_SITE_AGENT": "1",
        "STORMWATCH_SHARED": str(job_dir),
        "STORMWATCH_METRICS_DIR": str(metrics),
        "STORMWATCH_CONTROL_DIR": str(metrics / "control"),
        "STORMWATCH_VENV": str(Path(sys.executable).parent.parent),
        "STORMWATCH_MAX_RESTARTS": str(spec.max_restarts),
        "STORMWATCH_RDZV_PORT": str(rdzv_port),
        "STORMWATCH_TORCHRUN_LOG": str(job_dir / "%N.torchrun.log"),
        **program(state, spec),
        "GLOO_SOCKET_IFNAME": state.nodes[0].interface,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "PET_MONITOR_INTERVAL": str(MONITOR_INTERVAL),
        **spec.env,
    }


def program(state: LabState, spec: JobSpec) -> dict[str, str]:
    """What the recipe runs: ``spec.command`` (``STORMWATCH_COMMAND``), else ``stormwatch
    train`` with the job's options (``TRAIN_ARGS``)."""
    if spec.command is not None:
        return {"STORMWATCH_COMMAND": shlex.join(spec.command)}
    return {"TRAIN_ARGS": shlex.join(trainer_options(state, spec))}


def sbatch_args(state: LabState, spec: JobSpec, paths: RunPaths) -> list[str]:
    """``sbatch`` options (over the recipe's header) and the recipe."""
    if not RECIPE.is_file():
        raise JobError(f"the Slurm recipe {RECIPE} is missing (a checkout's deploy/slurm)")
    job_dir = paths.job_dir(spec.name)
    return [
        f"--job-name={spec.name}",
        f"--nodes={spec.node_count(state.config)}",
        f"--gpus-per-node={state.config.nproc_per_node}",
        "--cpus-per-task=1",
        f"--chdir={job_dir}",
        f"--output={job_dir / 'slurm-%j.out'}",
        str(RECIPE),
    ]


def start(
    state: LabState, spec: JobSpec, paths: RunPaths, base_env: dict[str, str], rdzv_port: int
) -> JobRecord:
    """Submit ``spec``, wait until it runs and every node's torchrun is up; its record.

    Raises:
        JobError: ``sbatch`` failed, or the job did not run (or its torchruns did not
            appear) within :data:`START_TIMEOUT_S` (it is cancelled then).
    """
    assert state.slurm is not None  # uses_slurm() said so
    check_elastic(state, spec)
    for folder in (paths.job_logs(spec.name), paths.job_checkpoints(spec.name)):
        folder.mkdir(parents=True, exist_ok=True)
    env = environment(state, spec, paths, base_env, rdzv_port)
    client = SlurmCommands(conf=state.slurm.conf, env=env)
    try:
        job_id = client.submit(sbatch_args(state, spec, paths))
    except BackendError as exc:
        raise JobError(f"could not submit job {spec.name!r} to Slurm: {exc}") from exc
    info = JobInfo.new(paths, spec, rdzv_port, slurm_job_id=job_id, slurm_conf=state.slurm.conf)
    record = JobRecord(info=info)
    try:
        nodes = _wait_running(client, job_id, START_TIMEOUT_S)
        info.node_logs = {n: paths.job_node_log(spec.name, n) for n in nodes}
        info.node_pids = _wait_torchruns(job_id, nodes, START_TIMEOUT_S)
    except BaseException as exc:  # Ctrl-C included: leave no job queued behind
        try:
            stop(record, grace=0.0)
        except JobError:  # said in the log; the start's own failure is the one to raise
            log.exception("could not stop Slurm job %s after its failed start", job_id)
        if isinstance(exc, Exception):
            raise JobError(f"job {spec.name!r} (Slurm job {job_id}) did not start: {exc}") from exc
        raise
    return record


def _wait_running(client: SlurmCommands, job_id: str, timeout: float) -> list[str]:
    """The job's nodes, in node-rank order, once it is RUNNING."""
    deadline = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if job.state == "RUNNING" and job.nodes:
            return list(client.hostnames(job.nodes))
        if job.state not in ACTIVE:
            raise JobError(f"Slurm job {job_id} is {job.state} ({job.reason or 'no reason'})")
        if time.monotonic() >= deadline:
            raise JobError(f"Slurm job {job_id} is {job.state} ({job.reason}) after {timeout:g} s")
        time.sleep(0.1)


def torchruns(job_id: str) -> dict[str, int]:
    """Node -> pid of the job's torchrun there (the lab shares one PID namespace)."""
    found: dict[str, int] = {}
    for proc in psutil.process_iter():
        try:
            cmdline = proc.cmdline()
            if not any(Path(arg).name == "torchrun" for arg in cmdline[:2]):
                continue
            env = proc.environ()
        except psutil.Error:  # gone, or not ours to read
            continue
        if env.get("SLURM_JOB_ID") == job_id and "SLURMD_NODENAME" in env:
            found.setdefault(env["SLURMD_NODENAME"], proc.pid)
    return found


def _wait_torchruns(job_id: str, nodes: list[str], timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        found = torchruns(job_id)
        if all(n in found for n in nodes):
            return {n: found[n] for n in nodes}
        if time.monotonic() >= deadline:
            missing = [n for n in nodes if n not in found]
            raise JobError(f"no torchrun of Slurm job {job_id} on {', '.join(missing)}")
        time.sleep(0.2)


def slurm_state(record: JobRecord) -> tuple[str, str]:
    """The job's Slurm state and exit code (``GONE`` when Slurm no longer knows it or does
    not answer: a job of a lab that is down)."""
    assert record.info.slurm_job_id is not None
    try:
        job = commands(record).job(record.info.slurm_job_id)
    except BackendError:
        return "GONE", ""
    return job.state, job.exit_code


def is_running(record: JobRecord) -> bool:
    """Whether Slurm still holds the job (pending, running, completing, requeued ...)."""
    return slurm_state(record)[0] in ACTIVE


def result(record: JobRecord) -> JobResult:
    """Per node: ``None`` while the job is active, 0 when it completed or the node's ranks
    all logged ``done``, the job's exit status otherwise (module docstring)."""
    state, exit_code = slurm_state(record)
    nodes = list(record.info.node_pids) or list(record.info.node_logs)
    if state in ACTIVE:
        return JobResult(name=record.info.name, ok=False, exit_codes=dict.fromkeys(nodes))
    done = _nodes_done(record, nodes)
    status = _exit_status(state, exit_code)
    codes: dict[str, int | None] = {
        n: 0 if state == "COMPLETED" or n in done else status for n in nodes
    }
    # A job slurmctld forgot (MinJobAge) or that outlived its cluster: the rank logs decide.
    ok = state == "COMPLETED" or (state == "GONE" and bool(nodes) and done == set(nodes))
    detail = None
    if not ok:
        failed = [n for n, c in codes.items() if c != 0] or nodes
        detail = (
            f"Slurm job {record.info.slurm_job_id} {state} (exit {exit_code or '?'}); "
            + "; ".join(f"{n}: {_lines(record, n)}" for n in failed)
        )
    return JobResult(name=record.info.name, ok=ok, exit_codes=codes, detail=detail)


def _exit_status(state: str, exit_code: str) -> int:
    status, _, signal = exit_code.partition(":")
    if signal.isdigit() and int(signal):
        return -int(signal)
    if status.isdigit() and int(status):
        return int(status)
    return -15 if state == "CANCELLED" else 1


def _nodes_done(record: JobRecord, nodes: list[str]) -> set[str]:
    """Nodes whose every rank's last record is ``done`` (ranks i*nproc.. on node i)."""
    logs = read_job_logs(Path(record.info.log_dir))
    nproc = (max(logs) + 1) // len(nodes) if nodes and logs else 0
    done = set()
    for index, node in enumerate(nodes):
        ranks = [logs.get(index * nproc + r) for r in range(nproc)]
        if nproc and all(log is not None and log.finished for log in ranks):
            done.add(node)
    return done


def _lines(record: JobRecord, node: str) -> str:
    from stormwatch.lab.jobs.launch import failure_lines  # the one torchrun log reader

    log_file = record.info.node_logs.get(node)
    if log_file is None:
        return "no output"
    return (" | ".join(failure_lines(Path(log_file))) or "no output") + f" [{log_file}]"


def stop(record: JobRecord, grace: float = 10.0) -> JobResult:
    """``scancel`` the job (Slurm sends SIGTERM, SIGKILL after ``KillWait``, the lab's grace
    period), wait up to ``grace`` + :data:`STOP_MARGIN_S` for Slurm to let it go, then stop
    what is left of it that Slurm no longer tracks (SIGTERM, SIGKILL after ``grace``:
    :func:`~stormwatch.platforms.lab_slurm.stop_slurm_job_leftovers`); then report.

    Raises:
        JobError: Slurm still holds the job after that wait, or one of its processes is
            still running after SIGKILL.
    """
    job_id = record.info.slurm_job_id
    assert job_id is not None
    try:
        commands(record)(["scancel", job_id])
    except BackendError:  # Slurm gone: the lab's teardown stops what is left
        return result(record)
    deadline = time.monotonic() + grace + STOP_MARGIN_S
    while is_running(record):
        if time.monotonic() >= deadline:
            raise JobError(
                f"job {record.info.name!r}: Slurm job {job_id} still {slurm_state(record)[0]} "
                f"{grace + STOP_MARGIN_S:g} s after scancel (see slurmd's log on its nodes)"
            )
        time.sleep(0.2)
    try:
        stop_slurm_job_leftovers(job_id, grace_s=grace)
    except NotStopped as exc:
        raise JobError(f"job {record.info.name!r}: {exc}") from exc
    return result(record)


def wait(record: JobRecord, timeout: float) -> JobResult:
    """Block until Slurm no longer holds the job.

    Raises:
        JobTimeoutError: still active after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while is_running(record):
        if time.monotonic() >= deadline:
            raise JobTimeoutError(
                f"job {record.info.name!r} (Slurm job {record.info.slurm_job_id}) still "
                f"{slurm_state(record)[0]} after {timeout:.0f} s; see {record.info.job_dir}"
            )
        time.sleep(0.5)
    return result(record)


__all__ = [
    "ACTIVE",
    "RECIPE",
    "STOP_MARGIN_S",
    "environment",
    "is_running",
    "program",
    "result",
    "sbatch_args",
    "start",
    "stop",
    "torchruns",
    "uses_slurm",
    "wait",
]
