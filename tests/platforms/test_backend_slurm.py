"""The slurm backend's command lines, recorded through its command client's runner seam
against a simulated cluster (states change as slurmctld's do), and the real runner against
real programs (a missing one, a failing one)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from stormwatch.platforms import BackendError, NotStopped
from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands, run_command
from stormwatch.platforms.slurm_readback import SlurmStop, SlurmWait

SQUEUE = ["squeue", "--noheader", "--name=llm", "--states=RUNNING", "--format=%i|%N"]
HOSTS = {
    "gpu-[07-08]": ["gpu-07", "gpu-08"],
    "gpu-[07,09]": ["gpu-07", "gpu-09"],
    "gpu-[08-09]": ["gpu-08", "gpu-09"],
}
STAMP = " [root@2026-12-02T03:14:00]"


class Slurm:
    """Answers squeue/scontrol like a cluster running job 4242 (``llm``) on gpu-07 and
    gpu-08, gpu-09 spare. A requeue leaves the job COMPLETING for ``completing_reads``
    reads (an update then is lost, as in Slurm), then PENDING for its BeginTime until
    ``StartTime``; ``stuck`` ignores StartTime and DRAIN updates."""

    def __init__(self, running: str | None = None, *, stuck: bool = False) -> None:
        self.running = running
        self.stuck = stuck
        self.calls: list[list[str]] = []
        self.lost: list[list[str]] = []
        self.job = {"state": "RUNNING", "nodes": "gpu-[07-08]", "restarts": 0, "excluded": ""}
        self.job["start"] = "2026-12-02T03:00:00"
        self.completing_reads = 2
        #: reads of ``squeue --steps`` that still list the old run's step once PENDING
        self.stale_steps = 0
        self.nodes = {n: ["MIXED", ""] for n in ("gpu-07", "gpu-08")} | {"gpu-09": ["IDLE", ""]}

    def __call__(self, argv: Sequence[str]) -> str:
        argv = list(argv)
        self.calls.append(argv)
        if argv[:3] == ["squeue", "--noheader", "--steps"]:
            if self.job["state"] == "PENDING" and self.stale_steps > 0:
                self.stale_steps -= 1
                return "4242.0\n"
            return "4242.batch\n4242.0\n" if self.job["state"] == "RUNNING" else ""
        if argv[0] == "squeue" and "--steps" not in argv:
            if self.running is not None:
                return self.running
            running = self.job["state"] == "RUNNING"
            return f"4242|{self.job['nodes']}\n" if running else ""
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return "".join(f"{h}\n" for h in HOSTS[argv[3]])
        if argv[:4] == ["scontrol", "--details", "show", "job"]:
            return "JobId=4242 JobName=llm JobState=RUNNING\n"
        if argv[:4] == ["scontrol", "--oneliner", "show", "job"]:
            return self._show_job()
        if argv[:4] == ["scontrol", "--oneliner", "show", "node"]:
            return "".join(self._show_node(n) for n in argv[4].split(","))
        if argv[:3] == ["scontrol", "show", "node"]:
            return "".join(self._show_node(n) for n in argv[3].split(","))
        if argv[:2] == ["scontrol", "requeue"]:
            self.job.update(state="COMPLETING", nodes="", restarts=int(self.job["restarts"]) + 1)
        elif argv[:2] == ["scontrol", "update"]:
            self._update(argv)
        return ""

    def _show_job(self) -> str:
        job = self.job
        if job["state"] == "COMPLETING":
            self.completing_reads -= 1
            if self.completing_reads < 0:
                job.update(state="PENDING", start="2026-12-02T03:30:10")
        reason = "BeginTime" if job["state"] == "PENDING" else "None"
        return (
            f"JobId=4242 JobName=llm JobState={job['state']} Reason={reason} Requeue=1 "
            f"Restarts={job['restarts']} SubmitTime=2026-12-02T02:59:59 "
            f"StartTime={job['start']} EndTime=Unknown ExcNodeList={job['excluded'] or '(null)'} "
            f"NodeList={job['nodes'] or '(null)'} BatchHost=gpu-07\n"
        )

    def _show_node(self, name: str) -> str:
        state, reason = self.nodes[name]
        if state.endswith("+NOT_RESPONDING"):  # slurmctld hears from a resumed node
            self.nodes[name][0] = state.split("+")[0]
        return f"NodeName={name} State={state}" + (f" Reason={reason}" if reason else "") + "\n"

    def _update(self, argv: list[str]) -> None:
        key, _, value = argv[2].partition("=")
        fields = dict(a.split("=", 1) for a in argv[3:])
        if key == "NodeName" and fields["State"] == "DRAIN" and not self.stuck:
            self.nodes[value] = [f"{self.nodes[value][0]}+DRAIN", fields["Reason"] + STAMP]
        elif key == "NodeName" and fields["State"] == "RESUME":
            self.nodes[value] = ["IDLE+NOT_RESPONDING", ""]
        elif self.job["state"] != "PENDING":
            self.lost.append(argv)
        elif "ExcNodeList" in fields:
            self.job["excluded"] = fields["ExcNodeList"]
        elif "StartTime" in fields and not self.stuck:
            free = [n for n in self.nodes if "DRAIN" not in self.nodes[n][0]]
            free = [n for n in free if n not in self.job["excluded"].split(",")]
            nodes = {"gpu-07,gpu-08": "gpu-[07-08]", "gpu-07,gpu-09": "gpu-[07,09]"}
            self.job.update(state="RUNNING", start="2026-12-02T03:30:01")
            self.job["nodes"] = nodes[",".join(free[:2])]

    def actions(self) -> list[list[str]]:
        """The calls that change something (requeue, update)."""
        return [c for c in self.calls if c[:2] in (["scontrol", "requeue"], ["scontrol", "update"])]


def _backend(slurm: Slurm, tmp_path: Path, **extra: object) -> SlurmBackend:
    return SlurmBackend(
        diagnostics_dir=tmp_path / "diag",
        nproc_per_node=4,
        commands=SlurmCommands(runner=slurm),
        wait=SlurmWait(timeout_s=0.5, poll_s=0.001),
        clock=lambda: 7.0,
        **extra,  # type: ignore[arg-type]
    )


def test_ranks_follow_the_node_order_of_the_allocation(tmp_path: Path) -> None:
    slurm = Slurm()
    placement = _backend(slurm, tmp_path).ranks("llm")
    assert placement == {r: "gpu-07" for r in range(4)} | {r: "gpu-08" for r in range(4, 8)}
    assert slurm.calls[0] == SQUEUE


def test_restart_requeues_then_starts_the_job_once_it_is_pending(tmp_path: Path) -> None:
    slurm = Slurm()
    detail = _backend(slurm, tmp_path).restart_workers("llm")
    assert detail.startswith(
        "requeued Slurm job 4242 (llm): RUNNING again on gpu-[07-08] (restart 1) after "
    )
    assert slurm.actions() == [
        ["scontrol", "requeue", "4242"],
        ["scontrol", "update", "JobId=4242", "StartTime=2026-12-02T03:00:01"],
    ]
    assert slurm.lost == []  # nothing was sent while the job was still COMPLETING


def test_a_restart_that_does_not_run_again_names_the_state_seen(tmp_path: Path) -> None:
    slurm = Slurm(stuck=True)
    with pytest.raises(
        BackendError, match=r"Slurm job 4242 not RUNNING again with its batch step after 0\.5 s"
    ) as err:
        _backend(slurm, tmp_path).restart_workers("llm")
    assert "last read: JobState=PENDING Reason=BeginTime Restarts=1 NodeList=(null)" in str(
        err.value
    )


def test_a_requeued_job_starts_again_only_once_its_old_steps_are_gone(tmp_path: Path) -> None:
    slurm = Slurm()
    slurm.stale_steps = 3  # PENDING, but squeue --steps still lists the old run's step
    _backend(slurm, tmp_path).restart_workers("llm")
    update = slurm.calls.index(
        ["scontrol", "update", "JobId=4242", "StartTime=2026-12-02T03:00:01"]
    )
    listed = [c for c in slurm.calls[:update] if c[:3] == ["squeue", "--noheader", "--steps"]]
    assert len(listed) == 4  # three still listed a step; the fourth found none: then started
    assert slurm.stale_steps == 0


def test_a_requeue_whose_old_run_never_goes_is_not_stopped_and_not_started(
    tmp_path: Path,
) -> None:
    slurm = Slurm()
    slurm.completing_reads = 10**6  # slurmd never reports the processes gone
    backend = _backend(slurm, tmp_path, stop=SlurmStop(grace_s=0.2))
    with pytest.raises(NotStopped) as err:
        backend.restart_workers("llm")
    message = str(err.value)
    assert message.startswith("Slurm job 4242: its processes not confirmed gone 0.7 s after the ")
    assert "(grace period 0.2 s; last read: JobState=COMPLETING" in message
    assert "not started again" in message
    assert slurm.actions() == [["scontrol", "requeue", "4242"]]  # no StartTime: not started


def test_a_requeue_stops_what_of_the_old_run_slurm_lost_track_of_before_starting_it(
    tmp_path: Path,
) -> None:
    stopped: list[tuple[str, str]] = []

    def leftovers(job_id: str) -> str:
        stopped.append((job_id, " ".join(slurm.actions()[-1])))
        return "stopped 1 process"

    slurm = Slurm()
    _backend(slurm, tmp_path, stop=SlurmStop(leftovers=leftovers)).restart_workers("llm")
    assert stopped == [("4242", "scontrol requeue 4242")]  # after the requeue, before StartTime
    assert slurm.actions()[-1][3].startswith("StartTime=")


def test_exclude_node_drains_it_with_a_reason_then_requeues_without_it(tmp_path: Path) -> None:
    slurm = Slurm()
    detail = _backend(slurm, tmp_path).exclude_node_and_restart("llm", "gpu-08")
    assert detail.startswith(
        "drained gpu-08 and requeued Slurm job 4242 (llm): RUNNING on gpu-[07,09] without gpu-08"
    )
    assert slurm.actions() == [
        [
            "scontrol",
            "update",
            "NodeName=gpu-08",
            "State=DRAIN",
            "Reason=stormwatch: excluded from job llm (4242)",
        ],
        ["scontrol", "requeue", "4242"],
        ["scontrol", "update", "JobId=4242", "ExcNodeList=gpu-08"],
        ["scontrol", "update", "JobId=4242", "StartTime=2026-12-02T03:00:01"],
    ]
    assert slurm.lost == []


def test_a_drain_that_does_not_show_is_an_error_before_any_requeue(tmp_path: Path) -> None:
    slurm = Slurm(stuck=True)
    with pytest.raises(BackendError, match="Slurm node gpu-08 not drained with reason") as err:
        _backend(slurm, tmp_path).exclude_node_and_restart("llm", "gpu-08")
    assert "last read: State=MIXED Reason=(null)" in str(err.value)
    assert ["scontrol", "requeue", "4242"] not in slurm.actions()


def test_resume_reads_the_node_back_in_service(tmp_path: Path) -> None:
    slurm = Slurm()
    slurm.nodes["gpu-08"] = ["IDLE+DRAIN", "link cut" + STAMP]
    detail = _backend(slurm, tmp_path).resume_node("gpu-08")
    assert detail.startswith("resumed gpu-08: IDLE after ")
    assert slurm.actions() == [["scontrol", "update", "NodeName=gpu-08", "State=RESUME"]]


def test_a_node_outside_the_allocation_is_not_drained(tmp_path: Path) -> None:
    slurm = Slurm()
    with pytest.raises(BackendError, match="no live worker on node 'gpu-99'"):
        _backend(slurm, tmp_path).exclude_node_and_restart("llm", "gpu-99")
    assert slurm.actions() == []


def test_no_running_job_and_two_running_jobs_are_errors(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="no live worker of job 'llm'"):
        _backend(Slurm(running=""), tmp_path).restart_workers("llm")
    with pytest.raises(BackendError, match=r"several running Slurm jobs \(1, 2\)"):
        _backend(Slurm(running="1|a\n2|b\n"), tmp_path).restart_workers("llm")


def test_checkpoint_goes_to_the_control_file_on_the_shared_filesystem(tmp_path: Path) -> None:
    control = str(tmp_path / "{job}-{jobid}" / "control")
    _backend(Slurm(), tmp_path, control_dir=control).request_checkpoint("llm")
    armed = json.loads((tmp_path / "llm-4242" / "control" / "rank0.json").read_text())
    assert armed == {"faults": [{"point": "checkpoint_now", "requested_at": 7.0}]}


def test_diagnostics_keep_scontrol_show_job_and_the_steps(tmp_path: Path) -> None:
    slurm = Slurm()
    _backend(slurm, tmp_path).collect_diagnostics("llm", 3)
    report = json.loads((tmp_path / "diag" / "incident-3.json").read_text())
    assert report["job_id"] == "4242" and report["nodes"] == ["gpu-07", "gpu-08"]
    assert report["scontrol_show_job"].startswith("JobId=4242")
    assert (
        report["scontrol_show_node"] == "NodeName=gpu-07 State=MIXED\nNodeName=gpu-08 State=MIXED\n"
    )
    assert report["job_state"]["state"] == "RUNNING" and report["job_state"]["restarts"] == 0
    assert ["scontrol", "--details", "show", "job", "4242"] in slurm.calls
    assert ["squeue", "--steps", "--jobs=4242"] in slurm.calls


def test_the_real_runner_reports_a_missing_program_and_a_failure() -> None:
    with pytest.raises(BackendError, match="squeue-not-installed: not found"):
        run_command(["squeue-not-installed"])
    with pytest.raises(BackendError, match="exit status 3: boom"):
        run_command(["sh", "-c", "echo boom >&2; exit 3"])
    assert run_command(["echo", "4242|n1"]) == "4242|n1\n"


def test_checkpoint_goes_to_rank_0s_node_when_the_control_dir_names_the_node(
    tmp_path: Path,
) -> None:
    """The lab's recipe reads control files from each node's own folder (``%n``): rank 0
    is on the allocation's first node."""
    control = str(tmp_path / "nodes" / "{node}" / "control")
    _backend(Slurm(), tmp_path, control_dir=control).request_checkpoint("llm")
    assert (tmp_path / "nodes" / "gpu-07" / "control" / "rank0.json").is_file()
    with pytest.raises(BackendError, match=r"only \{job\}, \{jobid\}, \{node\}"):
        _backend(Slurm(), tmp_path, control_dir="/x/{host}").request_checkpoint("llm")
