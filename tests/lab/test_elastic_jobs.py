"""Elastic lab jobs without a lab: command lines, global batch, FC-09's closed-rendezvous state,
a node's graceful leave (on a stand-in torchrun).

The real resize (lose a node, rejoin it) runs in tests/lab/test_elastic_lab.py
and, on loopback, in tests/trainer/test_e2e_elastic.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from stormwatch.lab import JobError, JobSpec, LabConfig
from stormwatch.lab.jobs import elastic, launch, torchrun
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.services import procs
from stormwatch.lab.state import JobInfo, JobRecord, LabState, ProcessRecord, plan_state


def _state(tmp_path: Path, nodes: int = 2) -> LabState:
    return plan_state(RunPaths(tmp_path), LabConfig(nodes=nodes))


def _command(state: LabState, spec: JobSpec, node_rank: int, tmp_path: Path) -> list[str]:
    return torchrun.torchrun_command(state, spec, node_rank, RunPaths(tmp_path), rdzv_port=29500)


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_an_elastic_job_asks_torchrun_for_min_to_max_nodes_and_the_trainer_for_auto_dp(tmp_path):
    state = _state(tmp_path, nodes=3)
    command = _command(state, JobSpec(name="el", nodes=3, min_nodes=1), 1, tmp_path)
    assert _option(command, "--nnodes") == "1:3"
    conf = dict(item.split("=") for item in _option(command, "--rdzv-conf").split(","))
    assert conf["is_host"] == "0"
    assert conf["keep_alive_interval"] == "1" and conf["last_call_timeout"] == "2"
    assert _option(command, "--dp") == "auto"
    # Every dp the job may run at (1, 2, 3 nodes) divides micro-batch 4 x lcm(1, 2, 3) = 24.
    assert _option(command, "--global-batch") == "24"


def test_a_fixed_size_job_keeps_its_command_line(tmp_path):
    state = _state(tmp_path)
    command = _command(state, JobSpec(name="fixed"), 0, tmp_path)
    assert _option(command, "--nnodes") == "2"
    assert _option(command, "--rdzv-conf") == "is_host=1"
    assert _option(command, "--dp") == "2"
    assert "--global-batch" not in command
    explicit = _command(state, JobSpec(name="fixed", global_batch=16), 0, tmp_path)
    assert _option(explicit, "--global-batch") == "16"


def test_min_nodes_above_the_lab_size_is_refused_naming_the_flag(tmp_path):
    with pytest.raises(JobError, match="min_nodes: 3 is more than the lab's 2 nodes; pass --min"):
        elastic.check_elastic(_state(tmp_path), JobSpec(name="el", min_nodes=3))


def _record(tmp_path: Path, spec: JobSpec, logs: dict[str, tuple[int | None, str]]) -> JobRecord:
    """A job whose node torchruns have ended (pid 1 with a wrong start time never matches)."""
    processes = {}
    for node, (code, text) in logs.items():
        log, status = tmp_path / f"{node}.log", tmp_path / f"{node}.status.json"
        log.write_text(text)
        status.write_text(json.dumps({"returncode": code, "ended_at": time.time()}))
        processes[node] = ProcessRecord(
            name=f"{spec.name}/{node}", pid=1, create_time=0.0, supervisor_pid=1,
            supervisor_create_time=0.0, cmd=["torchrun"], log_file=log, status_file=status,
            started_at=0.0,
        )  # fmt: skip
    info = JobInfo(
        name=spec.name, spec=spec, job_dir=tmp_path, log_dir=tmp_path, checkpoint_dir=tmp_path,
        node_pids={}, node_logs={}, started_at=0.0,
    )  # fmt: skip
    return JobRecord(info=info, processes=processes)


CLOSED_LOG = (
    "[rank0]: training...\n"
    "torch.distributed.elastic.rendezvous.api.RendezvousClosedError\n"
    "E1130 14:51:03.672000 5848 torch/distributed/elastic/...] failed\n"
)


def test_fc09_a_torchrun_ended_by_a_closed_rendezvous_is_recognised(tmp_path):
    spec = JobSpec(name="el", min_nodes=1)
    record = _record(tmp_path, spec, {"node0": (1, CLOSED_LOG), "node1": (0, "done\n")})
    assert elastic.rendezvous_closed(record) == ["node0"]
    other_failure = _record(tmp_path, spec, {"node0": (1, "ValueError: boom\n")})
    assert elastic.rendezvous_closed(other_failure) == []


def test_fc09_relaunch_gives_up_after_its_budget(tmp_path):
    spec = JobSpec(name="el", min_nodes=1)
    record = _record(tmp_path, spec, {"node0": (1, CLOSED_LOG)})
    record.info.relaunches = elastic.MAX_RELAUNCHES  # the budget is spent: the job fails as it is
    assert not launch.relaunch_closed(_state(tmp_path), record, RunPaths(tmp_path), {})


def test_rejoin_is_refused_for_a_fixed_size_job(tmp_path):
    record = _record(tmp_path, JobSpec(name="fixed"), {"node1": (-9, "")})
    with pytest.raises(JobError, match="fixed size; start it with --min-nodes"):
        launch.rejoin(_state(tmp_path), record, "node1", RunPaths(tmp_path), {})


def test_an_elastic_job_finished_by_the_survivors_is_ok_and_names_the_lost_node(tmp_path):
    spec = JobSpec(name="el", min_nodes=1)
    record = _record(tmp_path, spec, {"node0": (0, "done\n"), "node1": (-9, "")})
    outcome = launch.result(record)
    assert outcome.ok
    assert outcome.detail is not None and "finished on 1 of 2 nodes; lost: node1 (exit -9)" in (
        outcome.detail
    )
    fixed = _record(tmp_path, JobSpec(name="fixed"), {"node0": (0, "done\n"), "node1": (-9, "")})
    assert not launch.result(fixed).ok
    everyone_lost = _record(tmp_path, spec, {"node0": (-9, ""), "node1": (-9, "")})
    assert not launch.result(everyone_lost).ok


@pytest.mark.parametrize(
    ("spec", "node", "problem"),
    [
        (JobSpec(name="fixed"), "node1", "fixed size: a node leaving would end it"),
        (JobSpec(name="el", min_nodes=1), "node0", "node0 hosts the rendezvous of job 'el'"),
        (JobSpec(name="el", min_nodes=1), "node7", "no node 'node7' in job 'el'"),
        (JobSpec(name="el", min_nodes=1), "node1", "the torchrun of node1 in job 'el' is not run"),
    ],
)
def test_a_leave_that_cannot_be_graceful_is_refused(tmp_path, spec, node, problem):
    record = _record(tmp_path, spec, {"node0": (None, ""), "node1": (None, "")})
    with pytest.raises(JobError, match=problem):
        launch.leave(record, node, grace=1.0)


#: A stand-in torchrun: exits 143 on SIGTERM (``stubborn``: ignores it).
STAND_IN = """
import signal, sys, time
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
print("re" + "ady", flush=True)  # not the log's header line, which quotes this script
time.sleep(120)
"""


@pytest.mark.parametrize(
    ("mode", "grace", "status"), [("polite", 30.0, 143), ("stubborn", 0.5, -9)]
)
def test_a_leaving_node_gets_sigterm_then_sigkill_and_its_exit_status_is_recorded(
    tmp_path, mode, grace, status
):
    record = _record(tmp_path, JobSpec(name="el", min_nodes=1), {"node0": (None, "")})
    node1 = procs.launch(
        "el/node1",
        [sys.executable, "-c", STAND_IN, mode],
        log_file=tmp_path / "node1.torchrun.log",
        status_file=tmp_path / "node1.status.json",
    )
    record.processes["node1"] = node1
    deadline = time.monotonic() + 30
    while "ready" not in node1.log_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # its SIGTERM handler is in place
    try:
        assert launch.leave(record, "node1", grace=grace) == status
        assert procs.is_finished(node1)
    finally:
        procs.terminate(procs.tree(node1), grace=0.0)
