"""The command line and environment of one node's torchrun in a lab job.

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
* resolvable peers (``/etc/netns/<ns>/hosts``, see :mod:`stormwatch.lab.netns`), or every
  reverse lookup waits for an unreachable DNS server.

Elastic jobs (``JobSpec.min_nodes``): torchrun gets ``--nnodes MIN:MAX`` and
:data:`ELASTIC_RDZV_CONF`, the trainer ``--dp auto`` and a fixed
``--global-batch``. What torch 2.13 does (measured on loopback and in the lab,
see docs/ARCHITECTURE.md "Elastic resize"): when a non-host node's torchrun
dies (SIGTERM or SIGKILL), the survivors' workers fail in their next
collective, their torchrun drops the dead node from the rendezvous once its
heartbeat is ``keep_alive_interval x keep_alive_max_attempt`` seconds stale,
and restarts the worker group at the smaller world size (one restart counted
against ``--max-restarts``); the trainer resumes from the last checkpoint,
resharded. A node started again (:func:`.launch.rejoin`) is seen by the running
agents as a waiting node: they restart the group at the larger size (not
counted as a failure). If a torchrun nevertheless ends with
``RendezvousClosedError`` (FC-09: a rendezvous marked closed by a departing
agent, pytorch/pytorch#147064), :func:`.elastic.rendezvous_closed` recognises it in the
node's log and :func:`.launch.relaunch_closed` starts every node again under a fresh
rendezvous id, resuming from the checkpoint.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from stormwatch.lab.config import JobSpec
from stormwatch.lab.errors import JobError
from stormwatch.lab.jobs.elastic import ELASTIC_RDZV_CONF, global_batch_of
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.services.definitions import stormwatch_command
from stormwatch.lab.state import LabState, NodeState

#: torchrun's monitor interval, seconds: how often each agent looks at its workers and at
#: the rendezvous, so how fast it notices a dead worker or a peer node's restart; every
#: restart waits for it on each node in turn. torch's default. Measured with
#: benchmarks/recovery_bench.py on the 2-core machine (load 11-13, README.md "Benchmarks"):
#: 0.1 s against 0.5 s started the new workers 0.7 s sooner after a kill (median 1.49 s vs
#: 2.17 s, 6 and 12 trials) for about 2 % more of one core across both agents (9 % vs 7 %).
MONITOR_INTERVAL = 0.1


def torchrun_binary() -> str:
    """torchrun of this installation (next to the interpreter)."""
    script = Path(sys.executable).with_name("torchrun")
    if not script.exists():
        raise JobError(f"torchrun is not installed next to {sys.executable} (pip install torch)")
    return str(script)


def trainer_options(state: LabState, spec: JobSpec) -> list[str]:
    """``stormwatch train`` options that shape the job (degrees, steps, seed, checkpoint
    interval, global batch, ``spec.extra_args``); folders are the launcher's."""
    elastic = spec.min_nodes is not None
    cmd = [
        "--dp",
        "auto" if elastic else str(spec.node_count(state.config)),
        "--tp",
        str(state.config.nproc_per_node),
        "--job",
        spec.name,
        "--steps",
        str(spec.steps),
        "--step-delay",
        repr(spec.step_delay),
        "--seed",
        str(spec.seed),
    ]
    global_batch = global_batch_of(state, spec)
    if global_batch is not None:
        cmd += ["--global-batch", str(global_batch)]
    if spec.checkpoint_every > 0:
        cmd += ["--checkpoint-every", str(spec.checkpoint_every)]
    return [*cmd, *spec.extra_args]


def trainer_command(state: LabState, spec: JobSpec, node: NodeState, paths: RunPaths) -> list[str]:
    """What torchrun runs on ``node``: ``stormwatch train ...``, ``spec.command`` (as
    given), or ``spec.entrypoint`` (with ``spec.extra_args``)."""
    if spec.command is not None:
        return list(spec.command)
    if spec.entrypoint is not None:
        return [*spec.entrypoint, *spec.extra_args]
    options = trainer_options(state, spec)
    folders = ["--log-dir", str(paths.job_logs(spec.name)), "--metrics-dir", str(node.metrics_dir)]
    if spec.checkpoint_every > 0:  # without --checkpoint-dir the trainer does not checkpoint
        folders += ["--checkpoint-dir", str(paths.job_checkpoints(spec.name))]
    cut = len(options) - len(spec.extra_args)
    return [*stormwatch_command(), "train", *options[:cut], *folders, *options[cut:]]


def torchrun_command(
    state: LabState,
    spec: JobSpec,
    node_rank: int,
    paths: RunPaths,
    rdzv_port: int | None = None,
    rdzv_id: str | None = None,
) -> list[str]:
    """The torchrun command line of node ``node_rank`` (node 0 hosts the rendezvous on
    ``rdzv_port``, default ``LabConfig.rdzv_port``; ``rdzv_id`` defaults to the job name)."""
    config = state.config
    port = config.rdzv_port if rdzv_port is None else rdzv_port
    node = state.nodes[node_rank]
    host = state.nodes[0]
    rdzv_conf = f"is_host={1 if node_rank == 0 else 0}"
    nnodes = str(spec.node_count(config))
    if spec.min_nodes is not None:
        nnodes = f"{spec.min_nodes}:{nnodes}"
        rdzv_conf += "".join(f",{key}={value}" for key, value in ELASTIC_RDZV_CONF.items())
    return [
        torchrun_binary(),
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(config.nproc_per_node),
        "--node-rank",
        str(node_rank),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{host.address}:{port}",
        "--rdzv-id",
        spec.name if rdzv_id is None else rdzv_id,
        "--rdzv-conf",
        rdzv_conf,
        "--local-addr",
        str(node.address),
        "--max-restarts",
        str(spec.max_restarts),
        "--monitor-interval",
        str(MONITOR_INTERVAL),
        "--no-python",
        *trainer_command(state, spec, node, paths),
    ]


def folder_environment(paths: RunPaths, job: str) -> dict[str, str]:
    """The job's folders for a program that reads them from its environment: the
    telemetry API (``STORMWATCH_LOG_DIR``, ``STORMWATCH_DUMP_DIR``) and a training
    script's checkpoints (``STORMWATCH_CHECKPOINT_DIR``); the names and defaults of
    deploy/slurm/train.sbatch, which sets them for a job launched through Slurm."""
    logs = paths.job_logs(job)
    return {
        "STORMWATCH_LOG_DIR": str(logs),
        "STORMWATCH_DUMP_DIR": str(logs / "dumps"),
        "STORMWATCH_CHECKPOINT_DIR": str(paths.job_checkpoints(job)),
    }


def job_environment(
    spec: JobSpec, node: NodeState, base: dict[str, str], paths: RunPaths
) -> dict[str, str]:
    """Environment of one node's torchrun (inherited by its workers)."""
    return {
        **base,
        **folder_environment(paths, spec.name),
        "STORMWATCH_JOB": spec.name,
        "STORMWATCH_NODE": node.name,  # the node's name in the job attempt's records
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


def base_environment(marker: dict[str, str]) -> dict[str, str]:
    """This process's environment plus the lab marker (what every lab process inherits)."""
    return {**os.environ, **marker}


__all__ = [
    "MONITOR_INTERVAL",
    "base_environment",
    "folder_environment",
    "job_environment",
    "torchrun_binary",
    "torchrun_command",
    "trainer_command",
    "trainer_options",
]
