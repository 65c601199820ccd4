"""The Slurm backend's actions on a real cluster (munged, slurmctld, three slurmd), each
effect read back from Slurm, and the history readers on what they left behind.

The cluster is the shared fixture of tests/conftest.py with this module's own names
(bridge ``swsltx<xx>br0``, namespaces ``swsltx<xx>-node<i>``, a free 10.216.x.0/24 and a
free slurmctld port): three nodes, so that a two-node job has a spare to move to.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from stormwatch.lab.slurm import SlurmCluster
from stormwatch.platforms.slurm import SlurmBackend, SlurmJobInfo
from stormwatch.platforms.slurm_history import SlurmRecorder, read_slurm_history
from stormwatch.platforms.slurm_readback import SlurmWait

pytestmark = [pytest.mark.e2e, pytest.mark.root]

SLURM_PREFIX = "swsltx"
SLURM_SUBNET = "10.216"
SLURM_NODES = 3
JOB = "llm"
#: Requeue-and-start took 2-3 s here (the start is set 2 s after the requeue,
#: ``CREDENTIAL_GAP_S``); the bound leaves room for a loaded 2-core machine and stays far
#: below the ``cred_expire + 1`` s BeginTime wait it replaces (11 s on this cluster).
RESTART_BOUND_S = 8.0


def _backend(cluster: SlurmCluster, tmp_path: Path) -> SlurmBackend:
    return SlurmBackend(
        diagnostics_dir=tmp_path / "diag",
        nproc_per_node=2,
        control_dir=str(tmp_path / "{job}-{jobid}" / "control"),
        commands=cluster.commands,
        wait=SlurmWait(timeout_s=30.0),
    )


def _running_job(cluster: SlurmCluster, script: str = "sleep 300") -> SlurmJobInfo:
    """A two-node requeueable job named ``llm``, read back RUNNING."""
    job_id = cluster.commands.submit(
        [
            "--nodes=2",
            "--requeue",
            f"--job-name={JOB}",
            f"--chdir={cluster.config.run_dir}",
            "--wrap",
            script,
        ]
    )
    deadline = time.monotonic() + 20
    while (info := cluster.commands.job(job_id)).state != "RUNNING":
        assert time.monotonic() < deadline, f"job {job_id} is {info.state}, not RUNNING"
        time.sleep(0.05)
    return info


def test_restart_requeues_and_the_job_runs_again_within_seconds(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    before = _running_job(slurm_cluster)
    started = time.monotonic()
    detail = _backend(slurm_cluster, tmp_path).restart_workers(JOB)
    took = time.monotonic() - started
    print(f"requeue + StartTime to RUNNING: {took:.2f} s ({detail})")
    after = slurm_cluster.commands.job(before.job_id)
    assert after.state == "RUNNING" and after.restarts == before.restarts + 1
    assert f"{before.job_id}.batch" in slurm_cluster.commands.step_ids(before.job_id)
    assert after.start_time is not None and before.start_time is not None
    assert after.start_time >= before.start_time
    assert took < RESTART_BOUND_S
    assert detail.startswith(f"requeued Slurm job {before.job_id} ({JOB}): RUNNING again on ")


def test_exclude_node_drains_it_and_the_job_runs_on_the_spare(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    before = _running_job(slurm_cluster)
    commands = slurm_cluster.commands
    assert commands.hostnames(before.nodes) == ("node0", "node1")
    started = time.monotonic()
    detail = _backend(slurm_cluster, tmp_path).exclude_node_and_restart(JOB, "node1")
    took = time.monotonic() - started
    print(f"drain + requeue + ExcNodeList + StartTime to RUNNING on the spare: {took:.2f} s")
    after = commands.job(before.job_id)
    assert after.state == "RUNNING" and after.restarts == 1
    assert commands.hostnames(after.nodes) == ("node0", "node2")
    assert after.excluded == "node1"
    node = commands.nodes()["node1"]
    assert "DRAIN" in node.flags
    assert node.reason_text == f"stormwatch: excluded from job {JOB} ({before.job_id})"
    assert took < RESTART_BOUND_S
    assert "RUNNING on node[0,2] without node1" in detail


def test_resume_returns_a_drained_node_to_idle(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    commands = slurm_cluster.commands
    commands.update_node("node2", "DRAIN", reason="partition healed")
    assert commands.nodes()["node2"].state == "IDLE+DRAIN"
    detail = _backend(slurm_cluster, tmp_path).resume_node("node2")
    print(detail)
    node = commands.nodes()["node2"]
    assert (node.state, node.reason) == ("IDLE", None)


def test_diagnostics_and_checkpoint_name_the_job_by_id(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    info = _running_job(slurm_cluster, script="srun sleep 300")
    backend = _backend(slurm_cluster, tmp_path)
    deadline = time.monotonic() + 10  # the srun step registers a moment after RUNNING
    while f"{info.job_id}.0" not in slurm_cluster.commands.steps(info.job_id):
        assert time.monotonic() < deadline, "the job's srun step never showed"
        time.sleep(0.05)
    backend.collect_diagnostics(JOB, 9)
    report = json.loads((tmp_path / "diag" / "incident-9.json").read_text())
    assert report["job_id"] == info.job_id and report["nodes"] == ["node0", "node1"]
    assert report["job_state"]["state"] == "RUNNING"
    assert f"JobId={info.job_id} JobName={JOB}" in report["scontrol_show_job"]
    assert "NodeList=node[0-1]" in report["scontrol_show_job"]
    shown = [line for line in report["scontrol_show_node"].splitlines() if "NodeName=" in line]
    assert [line.split()[0] for line in shown] == ["NodeName=node0", "NodeName=node1"]
    assert f"{info.job_id}.0" in report["steps"] and f"{info.job_id}.batch" in report["steps"]
    backend.request_checkpoint(JOB)
    control = tmp_path / f"{JOB}-{info.job_id}" / "control" / "rank0.json"
    assert json.loads(control.read_text())["faults"][0]["point"] == "checkpoint_now"


def test_the_history_readers_see_pending_running_the_requeue_and_the_drain_reason(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    commands = slurm_cluster.commands
    job_id = commands.submit(
        [
            "--nodes=2",
            "--requeue",
            f"--job-name={JOB}",
            f"--chdir={slurm_cluster.config.run_dir}",
            "--begin=now+2",
            "--wrap",
            "sleep 300",
        ]
    )
    recorder = SlurmRecorder(commands, job_id)
    deadline = time.monotonic() + 20
    while commands.job(job_id).state != "RUNNING":
        recorder.sample()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    recorder.sample()
    _backend(slurm_cluster, tmp_path).exclude_node_and_restart(JOB, "node1")
    recorder.sample()
    subject = f"job {job_id} ({JOB})"
    told = [e.event for e in recorder.events if e.subject == subject]
    print("recorded:", *(f"{e.subject} {e.event} [{e.detail}]" for e in recorder.events), sep="\n")
    assert told[0] == "PENDING" and told[-1] == "RUNNING on node[0,2]"
    assert told.index("RUNNING on node[0-1]") < told.index("requeued (restart 1)")
    assert any(e.subject == "node node1" and "DRAIN" in e.event for e in recorder.events)
    pending = next(e for e in recorder.events if e.event == "PENDING")
    assert "Reason=BeginTime" in pending.detail

    history = read_slurm_history(commands, JOB)
    read = {(e.subject, e.event): e for e in history.events}
    assert (subject, "requeued (restart 1)") in read
    assert (subject, "started on node[0,2]") in read
    drained = read[("node node1", "drained")]
    assert drained.detail.endswith(f"Reason=stormwatch: excluded from job {JOB} ({job_id})")
    assert abs(drained.at - time.time()) < 60
    assert history.what.startswith(
        f"scontrol show job/node: Slurm jobs named 'llm': job id(s) {job_id};"
    )
