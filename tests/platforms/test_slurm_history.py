"""Slurm's records read as typed fields and events (recorded ``scontrol --oneliner`` text),
without a cluster; tests/platforms/test_slurm_live.py reads a real one."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import pytest

from stormwatch.platforms import BackendError
from stormwatch.platforms.slurm import (
    SlurmCommands,
    SlurmJobInfo,
    SlurmNodeInfo,
    parse_oneliner,
    slurm_time,
)
from stormwatch.platforms.slurm_history import (
    SlurmEvent,
    SlurmRecorder,
    job_events,
    node_events,
    read_slurm_history,
)

#: As 22.05 printed them (abridged), after one requeue onto the spare.
JOB = (
    "JobId=7 JobName=llm UserId=root(0) JobState=RUNNING Reason=None Requeue=1 Restarts=1 "
    "ExitCode=0:0 SubmitTime=2026-12-02T03:29:59 EligibleTime=2026-12-02T03:29:59 "
    "StartTime=2026-12-02T03:30:00 EndTime=Unknown ExcNodeList=node1 NodeList=node[0,2] "
    "BatchHost=node0\n"
)
NODES = (
    "NodeName=node0 State=MIXED CfgTRES=cpu=2 OS=Linux 6.1 #1 SMP\n"
    "NodeName=node1 State=IDLE+DRAIN OS=Linux 6.1 #1 SMP "
    "Reason=stormwatch: excluded from job llm (7) [root@2026-12-02T03:29:59]\n"
)


def _at(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def test_a_job_record_reads_restarts_times_and_excluded_nodes() -> None:
    job = SlurmJobInfo.of(parse_oneliner(JOB)[0])
    assert (job.restarts, job.excluded, job.nodes) == (1, "node1", "node[0,2]")
    assert job.submit_time == _at("2026-12-02T03:29:59")
    assert job.start_time == _at("2026-12-02T03:30:00")
    assert job.end_time is None


@pytest.mark.parametrize("text", ["Unknown", "None", "N/A", ""])
def test_slurm_times_that_are_not_times_read_as_none(text: str) -> None:
    assert slurm_time(text) is None


def test_a_node_reason_reads_without_and_with_its_stamp() -> None:
    node = SlurmNodeInfo.of(parse_oneliner(NODES)[1])
    assert node.reason_text == "stormwatch: excluded from job llm (7)"
    assert node.reason_time == _at("2026-12-02T03:29:59")
    assert SlurmNodeInfo("n", "IDLE", "no stamp").reason_time is None


def test_a_requeued_job_tells_its_requeue_and_its_start_on_the_spare() -> None:
    job = SlurmJobInfo.of(parse_oneliner(JOB)[0])
    detail = "Restarts=1 ExcNodeList=node1"
    assert job_events(job) == [
        SlurmEvent(_at("2026-12-02T03:29:59"), "job 7 (llm)", "requeued (restart 1)", detail),
        SlurmEvent(_at("2026-12-02T03:30:00"), "job 7 (llm)", "started on node[0,2]", detail),
    ]


def test_an_ended_job_tells_its_end_and_a_pending_one_no_start() -> None:
    ended = SlurmJobInfo(
        "8", "llm", "FAILED", "node0", "NonZeroExitCode", "1:0", 0, 10.0, 20.0, 30.0
    )
    assert [e.event for e in job_events(ended)] == [
        "submitted",
        "started on node0",
        "ended FAILED (exit 1:0)",
    ]
    pending = SlurmJobInfo("9", "llm", "PENDING", "", "BeginTime", "0:0", 1, 10.0, 40.0)
    assert [e.event for e in job_events(pending)] == ["requeued (restart 1)"]


def test_only_nodes_with_a_stamped_reason_make_events() -> None:
    nodes = [SlurmNodeInfo.of(r) for r in parse_oneliner(NODES)]
    nodes.append(
        SlurmNodeInfo("node3", "DOWN+NOT_RESPONDING", "Not responding [slurm@2026-12-02T03:31:00]")
    )
    assert [(e.subject, e.event, e.detail) for e in node_events(nodes)] == [
        (
            "node node1",
            "drained",
            "State=IDLE+DRAIN Reason=stormwatch: excluded from job llm (7)",
        ),
        ("node node3", "down", "State=DOWN+NOT_RESPONDING Reason=Not responding"),
    ]


def _cluster(jobs: list[str]) -> SlurmCommands:
    """``scontrol show job`` answers the next of ``jobs`` (the last one again at the end)."""

    def run(argv: Sequence[str]) -> str:
        if list(argv[:4]) == ["scontrol", "--oneliner", "show", "job"]:
            return jobs.pop(0) if len(jobs) > 1 else jobs[0]
        if list(argv[:4]) == ["scontrol", "--oneliner", "show", "node"]:
            return NODES
        raise AssertionError(argv)

    return SlurmCommands(runner=run)


def test_the_history_keeps_the_jobs_of_that_name_and_the_nodes_reasons_by_time() -> None:
    other = JOB.replace("JobId=7 JobName=llm", "JobId=6 JobName=other")
    history = read_slurm_history(_cluster([other + JOB]), "llm")
    assert [(e.subject, e.event) for e in history.events] == [
        ("job 7 (llm)", "requeued (restart 1)"),
        ("node node1", "drained"),
        ("job 7 (llm)", "started on node[0,2]"),
    ]
    assert history.what == (
        "scontrol show job/node: Slurm jobs named 'llm': job id(s) 7; 1 of 2 nodes with a reason"
    )


def test_the_recorder_returns_only_what_changed_between_samples() -> None:
    pending = JOB.replace("JobState=RUNNING Reason=None", "JobState=PENDING Reason=BeginTime")
    pending = pending.replace("Restarts=1", "Restarts=0").replace("NodeList=node[0,2]", "NodeList=")
    first_run = JOB.replace("Restarts=1", "Restarts=0").replace("node[0,2]", "node[0-1]")
    times = iter(range(100))
    recorder = SlurmRecorder(
        _cluster([pending, first_run, first_run, JOB]), "7", clock=lambda: next(times)
    )
    samples = [[(e.at, e.event) for e in recorder.sample()] for _ in range(4)]
    assert samples == [
        [(0, "PENDING"), (0, "state IDLE+DRAIN")],
        [(1, "RUNNING on node[0-1]")],
        [],
        [(3, "requeued (restart 1)"), (3, "RUNNING on node[0,2]")],
    ]
    assert len(recorder.events) == 5


def test_the_recorder_says_when_slurm_forgot_the_job() -> None:
    with pytest.raises(BackendError, match="scontrol show job 7: no such job"):
        SlurmRecorder(_cluster(["No jobs in the system\n"]), "7").sample()
