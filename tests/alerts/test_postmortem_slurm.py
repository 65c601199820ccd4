"""On the slurm platform, incident post-mortems put Slurm's job transitions and node drain
reasons into the timeline (a recorded cluster behind the command client's runner seam)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stormwatch.alerts.incident_report.build import build
from stormwatch.alerts.incident_report.sources import gather
from stormwatch.alerts.responder.service import ResponderSettings
from stormwatch.platforms import PlatformSettings
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.slurm import SlurmCommands

JOB = (
    "JobId=7 JobName=llm JobState=RUNNING Reason=None Restarts=1 ExitCode=0:0 "
    "SubmitTime=2026-12-02T03:29:59 StartTime=2026-12-02T03:30:01 EndTime=Unknown "
    "ExcNodeList=node1 NodeList=node[0,2]\n"
    "JobId=5 JobName=older JobState=COMPLETED Reason=None Restarts=0 ExitCode=0:0 "
    "SubmitTime=2026-12-02T03:29:00 StartTime=2026-12-02T03:29:01 EndTime=2026-12-02T03:29:30 "
    "NodeList=node0\n"
)
NODES = (
    "NodeName=node0 State=MIXED\n"
    "NodeName=node1 State=IDLE+DRAIN Reason=stormwatch: excluded from job llm (7) "
    "[root@2026-12-02T03:29:58]\n"
    "NodeName=node2 State=MIXED\n"
)
ALERT_AT = dt.datetime.fromisoformat("2026-12-02T03:29:50").timestamp()


def _slurm(argv: Sequence[str]) -> str:
    if list(argv[:4]) == ["scontrol", "--oneliner", "show", "job"]:
        return JOB
    if list(argv[:4]) == ["scontrol", "--oneliner", "show", "node"]:
        return NODES
    raise BackendError(f"{' '.join(argv)}: exit status 1: unexpected")


def _gather(kit: Any, slurm: SlurmCommands | None):  # type: ignore[no-untyped-def]
    labels = {"training_job": "llm"}
    incident = kit.closed_incident("StormwatchNodeLost", labels, ALERT_AT, incident_id=3)
    return gather(
        incident, [], [], now=ALERT_AT + 60, lab_run_dir=None, prometheus_url=None, slurm=slurm
    )


def test_the_timeline_shows_the_requeue_the_drain_and_the_start_on_the_spare(kit: Any) -> None:
    inputs = _gather(kit, SlurmCommands(runner=_slurm))
    pm = build(inputs, now=ALERT_AT + 60)
    slurm_rows = [(row.event, row.detail) for row in pm.timeline if row.source == "slurm"]
    assert slurm_rows == [
        (
            "slurm: node node1 drained",
            "State=IDLE+DRAIN Reason=stormwatch: excluded from job llm (7)",
        ),
        ("slurm: job 7 (llm) requeued (restart 1)", "Restarts=1 ExcNodeList=node1"),
        ("slurm: job 7 (llm) started on node[0,2]", "Restarts=1 ExcNodeList=node1"),
    ]
    assert [row.event for row in pm.timeline] == [  # merged by time with the alert's rows
        "alert firing",
        "incident 3 opened",
        "slurm: node node1 drained",
        "slurm: job 7 (llm) requeued (restart 1)",
        "slurm: job 7 (llm) started on node[0,2]",
        "alert resolved",
        "incident 3 closed",
    ]
    assert pm.inputs["slurm"] == (
        "scontrol show job/node: Slurm jobs named 'llm': job id(s) 7; 1 of 3 nodes with a reason "
        "(3 events in the window)"
    )


def test_an_unreadable_slurm_is_named_in_the_inputs_and_the_rest_is_written(kit: Any) -> None:
    def down(argv: Sequence[str]) -> str:
        raise BackendError("scontrol --oneliner show job: exit status 1: Unable to contact slurm")

    inputs = _gather(kit, SlurmCommands(runner=down))
    assert inputs.slurm_events == []
    assert inputs.inputs["slurm"].startswith("none: scontrol --oneliner show job: exit status 1")
    assert "slurm" not in _gather(kit, None).inputs


def test_a_lab_that_is_down_gives_one_warning_line_not_scontrol_s_munge_lines(
    kit: Any, caplog: Any
) -> None:
    munge = (  # scontrol's kind of errors once the lab's munged is gone (after `make demo`)
        "scontrol --oneliner show job: exit status 1: "
        "scontrol: error: If munged is up, restart with --num-threads=10\n"
        'scontrol: error: Munge encode failed: Failed to access "/run/munge/munge.socket.2"\n'
        "scontrol: error: slurm_send_node_msg: auth_g_create: REQUEST_JOB_INFO has "
        "authentication error\nslurm_load_jobs error: Protocol authentication error"
    )

    def down(argv: Sequence[str]) -> str:
        raise BackendError(munge)

    with caplog.at_level("WARNING"):
        inputs = _gather(kit, SlurmCommands(runner=down))
    [warning] = [r.getMessage() for r in caplog.records if "Slurm not read" in r.getMessage()]
    assert "\n" not in warning and "is slurmctld up?" in warning, warning
    assert warning.endswith("(+3 more lines in the report's inputs)"), warning
    assert inputs.inputs["slurm"] == f"none: {munge}"  # all of it, where it is kept


def test_the_responder_reads_slurm_for_post_mortems_only_on_the_slurm_platform(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "slurm.conf"
    settings = PlatformSettings.model_validate({"slurm": {"conf": str(conf)}})
    on_slurm = ResponderSettings(
        db_path=tmp_path / "r.sqlite",
        token_file=tmp_path / "t",
        platform="slurm",
        platform_settings=settings,
    )
    commands = on_slurm.slurm_commands()
    assert commands is not None and commands.environment()["SLURM_CONF"] == str(conf)
    on_lab = ResponderSettings(db_path=tmp_path / "r.sqlite", token_file=tmp_path / "t")
    assert on_lab.slurm_commands() is None
