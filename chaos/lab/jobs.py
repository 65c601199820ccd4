"""Training jobs in the lab: one torchrun per node namespace, joined over the lab bridge.

What torchrun needs across network namespaces (found by experiment on the lab
machine; all nodes share one hostname, so hostname-based defaults are wrong):

* ``--rdzv-endpoint <node0 address>:<rdzv_port>``: the c10d store runs on node 0
  and must be reachable from every namespace (the bridge address would not be:
  nothing listens in the root namespace).
* ``--rdzv-conf is_host=1`` on node 0, ``is_host=0`` elsewhere: torchrun would
  otherwise decide by comparing hostnames, which match in every namespace.
* ``--local-addr <node address>``: what a node advertises to the others (the
  rank-0 node's becomes every worker's MASTER_ADDR); the default, the hostname,
  resolves to 127.0.0.1.
* ``GLOO_SOCKET_IFNAME=eth0``: gloo binds to the namespace's bridge interface.
* resolvable peers (``/etc/netns/<ns>/hosts``, see :mod:`.netns`), or every
  reverse lookup waits for an unreachable DNS server.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from stormwatch.chaos.lab import procs
from stormwatch.chaos.lab.config import JobSpec
from stormwatch.chaos.lab.errors import JobError, JobTimeoutError
from stormwatch.chaos.lab.paths import RunPaths
from stormwatch.chaos.lab.services import stormwatch_command
from stormwatch.chaos.lab.state import JobInfo, JobRecord, JobResult, LabState, NodeState

#: Seconds between two looks at a running job's status files.
POLL_INTERVAL = 0.5
#: torchrun's monitor interval, seconds: how fast it notices a dead worker (default 0.1 s
#: in torch 2.x costs CPU on a two-core machine; 0.5 s still reacts within a step).
MONITOR_INTERVAL = 0.5


def torchrun_binary() -> str:
    """torchrun of this installation (next to the interpreter)."""
    script = Path(sys.executable).with_name("torchrun")
    if not script.exists():
        raise JobError(f"torchrun is not installed next to {sys.executable} (pip install torch)")
    return str(script)


def trainer_command(state: LabState, spec: JobSpec, node: NodeState, paths: RunPaths) -> list[str]:
    """What torchrun runs on ``node``: ``stormwatch train ...`` or ``spec.entrypoint``."""
    if spec.entrypoint is not None:
        return [*spec.entrypoint, *spec.extra_args]
    config = state.config
    cmd = [
        *stormwatch_command(),
        "train",
        "--dp",
        str(config.nodes),
        "--tp",
        str(config.nproc_per_node),
        "--job",
        spec.name,
        "--steps",
        str(spec.steps),
        "--step-delay",
        repr(spec.step_delay),
        "--seed",
        str(spec.seed),
        "--log-dir",
        str(paths.job_logs(spec.name)),
        "--metrics-dir",
        str(node.metrics_dir),
    ]
    if spec.checkpoint_every > 0:  # without --checkpoint-dir the trainer does not checkpoint
        cmd += [
            "--checkpoint-dir",
            str(paths.job_checkpoints(spec.name)),
            "--checkpoint-every",
            str(spec.checkpoint_every),
        ]
    return [*cmd, *spec.extra_args]


def torchrun_command(state: LabState, spec: JobSpec, node_rank: int, paths: RunPaths) -> list[str]:
    """The torchrun command line of node ``node_rank`` (node 0 hosts the rendezvous)."""
    config = state.config
    node = state.nodes[node_rank]
    host = state.nodes[0]
    return [
        torchrun_binary(),
        "--nnodes",
        str(config.nodes),
        "--nproc-per-node",
        str(config.nproc_per_node),
        "--node-rank",
        str(node_rank),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{host.address}:{config.rdzv_port}",
        "--rdzv-id",
        spec.name,
        "--rdzv-conf",
        f"is_host={1 if node_rank == 0 else 0}",
        "--local-addr",
        str(node.address),
        "--max-restarts",
        str(spec.max_restarts),
        "--monitor-interval",
        str(MONITOR_INTERVAL),
        "--no-python",
        *trainer_command(state, spec, node, paths),
    ]


def job_environment(spec: JobSpec, node: NodeState, base: dict[str, str]) -> dict[str, str]:
    """Environment of one node's torchrun (inherited by its workers)."""
    return {
        **base,
        "STORMWATCH_JOB": spec.name,
        "STORMWATCH_METRICS_DIR": str(node.metrics_dir),
        "GLOO_SOCKET_IFNAME": node.interface,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        # torchrun shares its rendezvous TCPStore with the workers by default; after
        # a restart on a multi-node job the new workers then read the previous
        # attempt's connection details and hang in init_process_group
        # (pytorch/pytorch#135712). A fresh store per attempt avoids it.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        **spec.env,
    }


def start(state: LabState, spec: JobSpec, paths: RunPaths, base_env: dict[str, str]) -> JobRecord:
    """Start one torchrun per node (node 0 first) and return the job's record.

    The processes are recorded in the returned record; if a later node cannot be
    started, the earlier ones are stopped before :class:`JobError` is raised.
    """
    for folder in (paths.job_logs(spec.name), paths.job_checkpoints(spec.name)):
        folder.mkdir(parents=True, exist_ok=True)
    for node in state.nodes:
        node.metrics_dir.mkdir(parents=True, exist_ok=True)
    record = JobRecord(
        info=JobInfo(
            name=spec.name,
            spec=spec,
            job_dir=paths.job_dir(spec.name),
            log_dir=paths.job_logs(spec.name),
            checkpoint_dir=paths.job_checkpoints(spec.name),
            node_pids={},
            node_logs={},
            started_at=time.time(),
        )
    )
    try:
        for rank, node in enumerate(state.nodes):
            process = procs.launch(
                f"{spec.name}/{node.name}",
                torchrun_command(state, spec, rank, paths),
                log_file=paths.job_node_log(spec.name, node.name),
                status_file=paths.job_node_status(spec.name, node.name),
                env=job_environment(spec, node, base_env),
                netns=node.netns,
                cwd=paths.job_dir(spec.name),
            )
            record.processes[node.name] = process
            record.info.node_pids[node.name] = process.pid
            record.info.node_logs[node.name] = process.log_file
    except BaseException as exc:  # Ctrl-C included: leave no half-started job behind
        stop(record)
        if isinstance(exc, Exception):
            raise JobError(f"could not start job {spec.name!r}: {exc}") from exc
        raise
    return record


def is_running(record: JobRecord) -> bool:
    """Whether any node of the job still runs (its supervisor included)."""
    return any(not procs.is_finished(p) for p in record.processes.values())


def result(record: JobRecord) -> JobResult:
    """Exit codes as recorded so far (``None`` for nodes still running or lost)."""
    codes = {node: procs.exit_status(p).returncode for node, p in record.processes.items()}
    ok = bool(codes) and all(code == 0 for code in codes.values())
    return JobResult(name=record.info.name, ok=ok, exit_codes=codes)


def wait(record: JobRecord, timeout: float) -> JobResult:
    """Block until every node's torchrun (and its supervisor) has exited.

    Raises:
        JobTimeoutError: after ``timeout`` seconds, naming the nodes still running.
    """
    deadline = time.monotonic() + timeout
    while True:
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
    """SIGTERM every node's torchrun and workers, SIGKILL after ``grace`` seconds, then report."""
    victims = [proc for p in record.processes.values() for proc in procs.tree(p)]
    procs.terminate(victims, grace=grace)
    # The supervisors write the exit status right after their command is gone.
    deadline = time.monotonic() + 10.0
    while is_running(record) and time.monotonic() < deadline:
        time.sleep(0.1)
    return result(record)


def base_environment(marker: dict[str, str]) -> dict[str, str]:
    """This process's environment plus the lab marker (what every lab process inherits)."""
    return {**os.environ, **marker}


__all__ = [
    "base_environment",
    "is_running",
    "job_environment",
    "result",
    "start",
    "stop",
    "torchrun_command",
    "trainer_command",
    "wait",
]
