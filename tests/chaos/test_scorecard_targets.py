"""The scorecard's detection targets (issue 18): class, target, culprit and false alarms."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, get_args

import pytest
from aiohttp import web

from stormwatch.chaos.experiment.model import ActionActivity
from stormwatch.chaos.gameday.culprits import (
    FaultPlace,
    culprit,
    culprit_correct,
    false_alarms,
    fault_place,
)
from stormwatch.chaos.gameday.scorecard import (
    FiredAlert,
    Scorecard,
    ScorecardRow,
    load_scorecard,
    render_markdown,
    write_scorecard,
)
from stormwatch.chaos.gameday.suite import SuiteEntry, load_suite, score
from stormwatch.chaos.gameday.targets import (
    TARGETS,
    JobPace,
    job_pace,
    target_seconds,
    within_target,
)
from stormwatch.chaos.reports.evidence import (
    PLACEMENT_QUERY,
    AlertEvidence,
    Evidence,
    RankPlacement,
    collect_evidence,
)
from stormwatch.chaos.reports.verify import Check, Verification
from stormwatch.contracts.journal import JobRef, Journal, SteadyState
from stormwatch.faults import REGISTRY, DetectClass, DetectClassBy, detect_class_of
from stormwatch.postmortem import ExperimentPostMortem
from stormwatch.telemetry.events import CheckpointFailedEvent, RankEvent, StepEvent
from stormwatch.telemetry.ranklogs import RankLog

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SUITE = ROOT / "experiments" / "suite"

# -- fault kind -> detection class ----------------------------------------------------------------

#: Every kind of the catalogue (``trainer_fault`` by its point) and its class (issue 18's table).
#: A kind added to the registry without a row here, or without a class, fails.
EXPECTED_CLASSES = {
    "kill_rank": DetectClass.RANK_KILLED,
    "freeze_rank": DetectClass.HUNG_RANK,
    "freeze_ranks": DetectClass.HUNG_RANK,
    "kill_torchrun": DetectClass.NODE_LOST,
    "kill_node_processes": DetectClass.NODE_LOST,
    "kill_rdzv_host": DetectClass.NODE_LOST,
    "kill_agent": DetectClass.AGENT_DOWN,
    "partition": DetectClass.PARTITION,
    "isolate_store": DetectClass.STORE_ISOLATION,
    "bandwidth_limit": DetectClass.BANDWIDTH_STARVED,
    "packet_drop": DetectClass.PACKET_LOSS,
    "link_flap": DetectClass.NODE_DOWN,
    "cpu_throttle": DetectClass.CPU_THROTTLE,
    "trainer_fault:slow_step": DetectClass.SLOW_RANK,
    "trainer_fault:collective_delay": DetectClass.SLOW_RANK,
    "trainer_fault:collective_hang": DetectClass.HUNG_RANK,
    "trainer_fault:error_at_step": DetectClass.RANK_KILLED,
    "gpu_xid": DetectClass.GPU_XID,
    "gpu_throttle": DetectClass.GPU_THROTTLE,
    "nvlink_down": DetectClass.NVLINK_DOWN,
    "nvlink_errors": DetectClass.NVLINK_ERRORS,
    "gpu_lost": DetectClass.GPU_LOST,
    "gpu_power_cap": DetectClass.GPU_THROTTLE,
    "checkpoint_readonly": DetectClass.CHECKPOINT_FAILING,
    "checkpoint_full": DetectClass.CHECKPOINT_FAILING,
}


class _Point:
    def __init__(self, point: str) -> None:
        self.point = point


def _catalogue() -> dict[str, DetectClass | None]:
    """Every kind (and every value of a field that decides the class) -> its class."""
    found: dict[str, DetectClass | None] = {}
    for kind, definition in REGISTRY.items():
        trait = definition.traits.detect_class
        if isinstance(trait, DetectClassBy):
            assert definition.request is not None
            for value in get_args(definition.request.model_fields[trait.field].annotation):
                found[f"{kind}:{value}"] = detect_class_of(kind, _Point(value))
        else:
            found[kind] = detect_class_of(kind)
    return found


def test_every_fault_kind_of_the_catalogue_has_its_detection_class() -> None:
    assert _catalogue() == EXPECTED_CLASSES


def test_every_detection_class_has_a_target_rule() -> None:
    assert set(TARGETS) == set(DetectClass)


def test_every_default_suite_fault_has_a_class_with_a_target() -> None:
    for entry in load_suite(DEFAULT_SUITE):
        action = next(a for a in entry.experiment.method if isinstance(a, ActionActivity))
        detect_class = detect_class_of(action.fault.kind, action.fault)
        assert detect_class is not None, entry.path
        assert TARGETS[detect_class].rule != "none", entry.path


# -- targets --------------------------------------------------------------------------------------


def _steps(rank: int, times: list[float], *, seconds: float, first: int = 1) -> list[RankEvent]:
    return [
        StepEvent(time=t, step=first + i, step_seconds=seconds, attempt=0)
        for i, t in enumerate(times)
    ]


@pytest.mark.parametrize(
    ("detect_class", "median_step", "expected"),
    [
        (DetectClass.RANK_KILLED, None, 2.0),
        (DetectClass.NODE_LOST, None, 2.0),
        (DetectClass.GPU_XID, None, 2.0),
        (DetectClass.GPU_LOST, None, 2.0),
        (DetectClass.HUNG_RANK, 0.1, 7.0),  # max(0.3, 5) + 2: the floor
        (DetectClass.HUNG_COLLECTIVE, 1.0, 7.0),  # max(3, 5) + 2
        (DetectClass.PARTITION, 4.0, 14.0),  # max(12, 5) + 2
        (DetectClass.STORE_ISOLATION, 2.0, 8.0),  # max(6, 5) + 2
        (DetectClass.HUNG_RANK, None, None),  # no step time: no target
        (DetectClass.NVLINK_DOWN, None, 5.0),
        (DetectClass.AGENT_DOWN, None, 5.0),
        (DetectClass.NODE_DOWN, None, 10.0),
        (DetectClass.SLOW_RANK, None, 20.0),
        (DetectClass.CPU_THROTTLE, None, 20.0),
        (DetectClass.BANDWIDTH_STARVED, None, 30.0),
        (DetectClass.PACKET_LOSS, None, 30.0),
        (DetectClass.CHECKPOINT_FAILING, None, None),  # no failed save: no target
        (DetectClass.GPU_THROTTLE, None, None),
        (DetectClass.NVLINK_ERRORS, None, None),
    ],
)
def test_each_class_target_in_seconds(
    detect_class: DetectClass, median_step: float | None, expected: float | None
) -> None:
    pace = JobPace(median_step_seconds=median_step)
    assert target_seconds(TARGETS[detect_class], pace, 100.0) == expected


@pytest.mark.parametrize(
    ("target", "ttd", "detected", "expected_detect", "within"),
    [
        (2.0, 1.4, True, True, True),
        (2.0, 2.0, True, True, True),  # on the target is within it
        (2.0, 2.1, True, True, False),
        (7.0, 30.0, True, True, False),  # the hung rule's 30 s stall window
        (2.0, None, False, True, False),  # expected and never detected
        (2.0, None, False, False, None),  # not expected to be detected
        (None, 1.0, True, True, None),  # no target
        (2.0, None, None, True, None),  # no fault injected
    ],
)
def test_within_target(
    target: float | None,
    ttd: float | None,
    detected: bool | None,
    expected_detect: bool,
    within: bool | None,
) -> None:
    assert within_target(target, ttd, detected=detected, expected=expected_detect) is within


def test_the_hung_target_takes_the_median_step_interval_before_the_fault() -> None:
    # a step every 3 s, 1 s of it in the step (the rest between steps: a data loader, a
    # step_delay); the agent's hang threshold takes the interval, so does the target
    logs = {
        0: RankLog(0, _steps(0, [3.0, 6.0, 9.0, 12.0], seconds=1.0)),
        # rank 1's last step (after the fault at 10.5) is slow: it does not count
        1: RankLog(1, _steps(1, [3.0, 6.0, 9.0], seconds=1.0) + _steps(1, [90.0], seconds=60.0)),
    }
    pace = job_pace(logs, 10.5, checkpoint_every=10)
    assert pace.median_step_seconds == 1.0
    assert pace.median_step_interval_seconds == 3.0
    assert target_seconds(TARGETS[DetectClass.HUNG_RANK], pace, 10.5) == 11.0  # 3 x 3 + 2
    # one step each before the fault: no interval, the step time serves
    first = {r: RankLog(r, _steps(r, [6.0], seconds=2.0)) for r in range(2)}
    pace = job_pace(first, 10.5, checkpoint_every=10)
    assert pace.median_step_interval_seconds is None
    assert target_seconds(TARGETS[DetectClass.HUNG_RANK], pace, 10.5) == 8.0  # 3 x 2 + 2


def test_the_checkpoint_target_is_the_next_save_after_the_first_failed_one() -> None:
    # steps every 0.5 s from t=100; the fault at 106 (after step 12), step 20's save fails
    times = [100.0 + 0.5 * i for i in range(40)]
    failed = CheckpointFailedEvent(time=110.2, step=20, error="ENOSPC")
    logs = {r: RankLog(r, [*_steps(r, times, seconds=0.1), failed]) for r in range(2)}
    pace = job_pace(logs, 106.0, checkpoint_every=10)
    assert (pace.first_failed_save_at, pace.first_failed_save_step) == (110.2, 20)
    assert pace.next_save_at == 114.5  # step 30 completed: its save starts
    target = target_seconds(TARGETS[DetectClass.CHECKPOINT_FAILING], pace, 106.0)
    assert target == pytest.approx(8.5)
    # the job stopped before step 30: estimated from the step interval before the fault
    short = {r: RankLog(r, [*_steps(r, times[:25], seconds=0.1), failed]) for r in range(2)}
    assert job_pace(short, 106.0, checkpoint_every=10).next_save_at == pytest.approx(115.2)
    # a save that failed before the fault is not the fault's
    early = CheckpointFailedEvent(time=104.0, step=10)
    assert job_pace({0: RankLog(0, [early])}, 106.0, 10).first_failed_save_at is None


# -- culprit --------------------------------------------------------------------------------------

_PLACEMENTS = [RankPlacement(training_job="j", rank=r, node=f"node{r // 2}") for r in range(4)] + [
    RankPlacement(training_job="other", rank=3, node="node0")
]


def _place(kind: str, rank: int | None, node: str | None, **spec: Any) -> FaultPlace:
    definition = REGISTRY[kind]
    fields = {"kind": kind, **spec}
    if rank is not None and "nodes" not in spec:
        fields["rank"] = rank
    experiment_fault = definition.experiment.model_validate(fields)
    return fault_place(
        kind=kind,
        spec=experiment_fault,
        job="j",
        rank=rank,
        node=node,
        placements=_PLACEMENTS,
    )


SLOW = _place("trainer_fault", 1, "node0", point="slow_step", seconds=1.0)
KILL = _place("kill_rank", 1, "node0")
NODE_LOSS = _place("kill_node_processes", 2, "node1")
PARTITION = _place("partition", None, "node1", nodes=["node1"])
STARVED = _place("bandwidth_limit", 2, "node1", rate_kbit=20000)
XID = _place("gpu_xid", 2, "node1", gpu=0, xid=79)
NVLINK = _place("nvlink_down", 2, "node1", gpu=0)


def _alert(name: str, at: float = 110.0, **labels: str) -> AlertEvidence:
    return AlertEvidence(alertname=name, labels={"alertname": name, **labels}, firing_at=at)


@pytest.mark.parametrize(
    ("place", "detect_class", "alert", "others", "correct"),
    [
        # the slowed rank named, and no waiting rank
        (SLOW, DetectClass.SLOW_RANK, _alert("Straggler", rank="1", node="node0"), [], True),
        # a waiting rank named instead
        (SLOW, DetectClass.SLOW_RANK, _alert("Straggler", rank="0", node="node0"), [], False),
        # the slowed rank named, but a waiting rank named too by the same rule
        (
            SLOW,
            DetectClass.SLOW_RANK,
            _alert("Straggler", rank="1", node="node0"),
            [_alert("Straggler", rank="2", node="node1")],
            False,
        ),
        # another rule naming another rank is no "waiting rank named" by the detecting rule
        (
            SLOW,
            DetectClass.SLOW_RANK,
            _alert("Straggler", rank="1"),
            [_alert("RankStalled", rank="2")],
            True,
        ),
        # a job-level alert names no rank: the slow classes need one
        (SLOW, DetectClass.SLOW_RANK, _alert("ThroughputDrop", training_job="j"), [], False),
        (
            KILL,
            DetectClass.RANK_KILLED,
            _alert("RankStalled", training_job="j", rank="1"),
            [],
            True,
        ),
        (
            KILL,
            DetectClass.RANK_KILLED,
            _alert("RankStalled", training_job="j", rank="0"),
            [],
            False,
        ),
        (KILL, DetectClass.RANK_KILLED, _alert("NodeDown", node="node0"), [], True),
        (KILL, DetectClass.RANK_KILLED, _alert("NodeDown", node="node1"), [], False),
        # a job-level alert for a class that needs no culprit: not judged
        (KILL, DetectClass.RANK_KILLED, _alert("TrainingHung", training_job="j"), [], None),
        # another job's alert is never the culprit
        (
            KILL,
            DetectClass.RANK_KILLED,
            _alert("RankStalled", training_job="other", rank="1"),
            [],
            False,
        ),
        # a node fault: any rank the job ran on the node names it
        (NODE_LOSS, DetectClass.NODE_LOST, _alert("RankStalled", rank="3"), [], True),
        (NODE_LOSS, DetectClass.NODE_LOST, _alert("RankStalled", rank="0"), [], False),
        # a partition without peers: every node is on one side or the other
        (PARTITION, DetectClass.PARTITION, _alert("RankStalled", rank="0"), [], True),
        # a degraded link: the node must be named
        (STARVED, DetectClass.BANDWIDTH_STARVED, _alert("ThroughputDrop"), [], False),
        (STARVED, DetectClass.BANDWIDTH_STARVED, _alert("LinkSlow", node="node1"), [], True),
        (STARVED, DetectClass.BANDWIDTH_STARVED, _alert("LinkSlow", node="node0"), [], False),
        (STARVED, DetectClass.BANDWIDTH_STARVED, _alert("Straggler", rank="3"), [], True),
        # the faulted GPU, on the faulted node
        (XID, DetectClass.GPU_XID, _alert("GpuXidFatal", node="node1", gpu="0"), [], True),
        (XID, DetectClass.GPU_XID, _alert("GpuXidFatal", node="node1", gpu="1"), [], False),
        (XID, DetectClass.GPU_XID, _alert("GpuXidFatal", node="node0", gpu="0"), [], False),
        # NVLink down names no link: every link of the GPU is faulted
        (
            NVLINK,
            DetectClass.NVLINK_DOWN,
            _alert("NvlinkDown", node="node1", gpu="0", link="3"),
            [],
            True,
        ),
    ],
)
def test_culprit_correctness(
    place: FaultPlace,
    detect_class: DetectClass,
    alert: AlertEvidence,
    others: list[AlertEvidence],
    correct: bool | None,
) -> None:
    got = culprit_correct(
        alert.alertname,
        alert.labels,
        place=place,
        target=TARGETS[detect_class],
        alerts=[alert, *others],
    )
    assert got is correct


def test_the_culprit_is_what_the_alert_names() -> None:
    labels = {"alertname": "X", "training_job": "j", "rank": "1", "node": "n", "severity": "c"}
    assert culprit(labels) == {"rank": "1", "node": "n"}
    assert culprit({"training_job": "j"}) == {}
    assert culprit_correct(None, {}, place=KILL, target=None) is None  # nothing detected


# -- false alarms ---------------------------------------------------------------------------------

#: kill_rank rank 1 (node0) of job j at t=100, the experiment from t=50 to t=200,
#: expect.alerts [RankStalled]: alert -> is it a false alarm?
FALSE_ALARMS = [
    (
        "the expected alert naming the rank",
        _alert("RankStalled", training_job="j", rank="1"),
        False,
    ),
    (
        "an expected name naming another rank",
        _alert("RankStalled", training_job="j", rank="2"),
        False,
    ),
    ("a job-level consequence after the fault", _alert("TrainingHung", training_job="j"), False),
    ("the faulted rank's node", _alert("GpuXidFatal", node="node0", gpu="1"), False),
    ("a cluster-level alert after the fault", _alert("AgentsBelowDesired"), False),
    ("a job-level alert before the fault", _alert("LossSpike", 80.0, training_job="j"), True),
    ("another rank by another rule", _alert("RankHungInPhase", training_job="j", rank="2"), True),
    ("another node", _alert("NodeDown", node="node1"), True),
    (
        "another job, even by an expected name",
        _alert("RankStalled", training_job="old", rank="1"),
        True,
    ),
    (
        "an expected name before the fault",
        _alert("RankStalled", 80.0, training_job="j", rank="1"),
        True,
    ),
    ("already firing before the experiment", _alert("NodeDown", 40.0, node="node1"), False),
    ("fired after the experiment ended", _alert("NodeDown", 210.0, node="node1"), False),
]


@pytest.mark.parametrize(
    ("alert", "is_false_alarm"),
    [(a, f) for _, a, f in FALSE_ALARMS],
    ids=[why for why, _, _ in FALSE_ALARMS],
)
def test_false_alarm_classification(alert: AlertEvidence, is_false_alarm: bool) -> None:
    found = false_alarms(
        [alert],
        place=KILL,
        expected=["RankStalled"],
        fault_at=100.0,
        started_at=50.0,
        ended_at=200.0,
    )
    assert (found == [alert]) is is_false_alarm


def test_without_a_fault_every_unexpected_alert_of_the_experiment_is_a_false_alarm() -> None:
    alerts = [_alert("RankStalled", rank="1"), _alert("TrainingHung", training_job="j")]
    found = false_alarms(
        alerts, place=KILL, expected=["RankStalled"], fault_at=None, started_at=0, ended_at=None
    )
    assert [a.alertname for a in found] == ["TrainingHung"]


# -- the row --------------------------------------------------------------------------------------


def _journal() -> Journal:
    return Journal(
        experiment_id="20260101T000000-x-abcd",
        title="x",
        file=Path("x.yaml"),
        experiment={},
        started_at=50.0,
        ended_at=200.0,
        status="completed",
        job=JobRef(name="j", log_dir=Path("/nonexistent"), world_size=4, started_by_runner=True),
        steady_state_before=SteadyState(met=True),
        steady_state_after=SteadyState(met=True),
        rollbacks_ok=True,
    )


def _pm(ttd: float, **labels: str) -> ExperimentPostMortem:
    return ExperimentPostMortem.model_validate(
        {
            "experiment_id": "x",
            "title": "x",
            "status": "completed",
            "hypothesis_held": True,
            "rollbacks_ok": True,
            "job": "j",
            "fault_kind": "kill_rank",
            "fault_rank": 1,
            "fault_node": "node0",
            "fault_at": 100.0,
            "detected": True,
            "alertname": "StormwatchRankStalled",
            "alert_labels": {"alertname": "StormwatchRankStalled", "training_job": "j", **labels},
            "time_to_detect_seconds": ttd,
        }
    )


ALL_OK = Verification(
    loss=Check(ok=True, detail="bitwise equal"),
    checkpoint=Check(ok=True, detail="loads"),
    faults_cleared=Check(ok=True, detail="none left"),
)


def _rank_kill(strict_in_file: bool = False) -> SuiteEntry:
    entry = next(e for e in load_suite(DEFAULT_SUITE) if e.path.name == "01-rank-kill.yaml")
    if not strict_in_file:
        return entry
    expect = entry.experiment.expect.model_copy(update={"strict_targets": True})
    return SuiteEntry(entry.path, entry.experiment.model_copy(update={"expect": expect}))


def test_a_row_within_its_target_naming_the_rank_passes_strict_or_not(tmp_path: Path) -> None:
    row = score(
        _rank_kill(), _journal(), _pm(1.4, rank="1"), ALL_OK, [], tmp_path, strict_targets=True
    )
    assert row.verdict == "pass", row.reasons
    assert (row.detect_class, row.target_seconds, row.within_target) == ("rank_killed", 2.0, True)
    assert (row.culprit, row.culprit_correct, row.false_alarms) == ({"rank": "1"}, True, [])
    assert row.targets_enforced is True


def test_targets_fail_a_row_only_where_enforced(tmp_path: Path) -> None:
    """Late, the wrong rank named, and a false alarm: reported by default, failed when the
    suite says --strict-targets or the file says expect.strict_targets."""
    alarm = _alert("StormwatchNodeDown", 150.0, node="node1")
    args = (_journal(), _pm(7.0, rank="2"), ALL_OK, [alarm], tmp_path)
    row = score(_rank_kill(), *args)
    assert row.verdict == "pass", row.reasons
    assert (row.within_target, row.culprit_correct, row.targets_enforced) == (False, False, False)
    assert row.false_alarms == [
        FiredAlert(alertname="StormwatchNodeDown", labels={"node": "node1"}, firing_at=150.0)
    ]
    for strict in (score(_rank_kill(), *args, strict_targets=True), score(_rank_kill(True), *args)):
        assert strict.verdict == "fail"
        assert strict.reasons == [
            "detected in 7.0 s, over the rank_killed target (2.0 s)",
            "culprit: StormwatchRankStalled names rank=2, not the fault's rank 1 on node0",
            '1 false alarm(s): StormwatchNodeDown{node="node1"}',
        ]


def test_the_evidence_keeps_every_firing_alert_and_where_each_rank_ran() -> None:
    now = time.time()

    def matrix(labels: dict[str, str]) -> dict[str, Any]:
        return {"metric": labels, "values": [[now - 30, "1"], [now - 25, "1"]]}

    async def query_range(request: web.Request) -> web.Response:
        form = dict(request.query) | dict(await request.post())
        if form["query"] == PLACEMENT_QUERY:
            result = [
                matrix({"training_job": "j", "rank": "3", "node": "node1"}),
                matrix({"training_job": "j", "rank": "0", "node": "node0"}),
            ]
        else:
            alert = {"alertname": "StormwatchNodeDown", "alertstate": "firing", "node": "node1"}
            result = [matrix({"__name__": "ALERTS", **alert})]
        return web.json_response(
            {"status": "success", "data": {"resultType": "matrix", "result": result}}
        )

    async def alerts(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": {"alerts": []}})

    async def scenario() -> Evidence:
        app = web.Application()
        app.router.add_route("*", "/api/v1/query_range", query_range)
        app.router.add_get("/api/v1/alerts", alerts)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            return await collect_evidence(
                window_start=now - 60, prometheus_url=f"http://{host}:{port}", responder_url=None
            )
        finally:
            await runner.cleanup()

    evidence = asyncio.run(scenario())
    assert evidence.prometheus_error is None
    assert evidence.ranks == [
        RankPlacement(training_job="j", rank=0, node="node0"),
        RankPlacement(training_job="j", rank=3, node="node1"),
    ]
    assert [(a.alertname, a.labels["node"]) for a in evidence.alerts] == [
        ("StormwatchNodeDown", "node1")
    ]


def test_evidence_saved_before_the_ranks_placement_loads_without_it() -> None:
    old = {"window_start": 0.0, "window_end": 1.0, "alerts": []}
    assert Evidence.model_validate(old).ranks == []
    new = Evidence.model_validate({**old, "ranks": [{"training_job": "j", "rank": 3, "node": "n"}]})
    assert new.ranks == [RankPlacement(training_job="j", rank=3, node="n")]


# -- the scorecard --------------------------------------------------------------------------------


def test_a_scorecard_written_before_the_target_columns_still_loads(tmp_path: Path) -> None:
    old_row = {
        "file": "01.yaml",
        "title": "kill",
        "fault": "kill_rank rank 1",
        "fault_kind": "kill_rank",
        "status": "completed",
        "detected": True,
        "alert": "StormwatchRankStalled",
        "time_to_detect_seconds": 1.4,
        "verdict": "pass",
        "reasons": [],
    }
    old = {
        "suite_id": "20260101T000000-suite-0001",
        "suite_dir": "experiments/suite",
        "run_dir": str(tmp_path),
        "started_at": 0.0,
        "rows": [old_row],
    }
    path = tmp_path / "scorecard.json"
    path.write_text(json.dumps(old))
    card = load_scorecard(path)
    row = card.rows[0]
    assert (row.detect_class, row.target_seconds, row.within_target) == (None, None, None)
    assert (row.culprit, row.culprit_correct, row.false_alarms) == ({}, None, None)
    assert card.strict_targets is False
    assert "| — | — | — | — |" in render_markdown(card)  # target s, in target, culprit, ok


def test_the_markdown_has_the_target_columns_and_ends_with_the_totals(tmp_path: Path) -> None:
    def row(name: str, detect_class: str, **fields: Any) -> ScorecardRow:
        return ScorecardRow(file=f"{name}.yaml", title=name, detect_class=detect_class, **fields)

    alarm = FiredAlert(alertname="StormwatchNodeDown", labels={"node": "node1"})
    card = Scorecard(
        suite_id="s",
        suite_dir="experiments/suite",
        run_dir=str(tmp_path),
        started_at=0.0,
        rows=[
            row("kill", "rank_killed", target_seconds=2.0, within_target=True, false_alarms=[]),
            row(
                "slow",
                "slow_rank",
                target_seconds=20.0,
                within_target=False,
                culprit={"rank": "0", "node": "node0"},
                culprit_correct=False,
                false_alarms=[alarm],
            ),
            row(
                "slow-2", "slow_rank", target_seconds=20.0, within_target=True, culprit_correct=True
            ),
            row("throttle", "gpu_throttle"),  # no target: not judged
        ],
    )
    md, _ = write_scorecard(card, tmp_path)
    text = md.read_text()
    assert "| class | detected | by alert | detect s | target s | in target | culprit |" in text
    assert "| slow_rank | — | — | — | 20.0 | **no** | rank=0 node=node0 | **no** | **1** |" in text
    assert '* `slow.yaml`: `StormwatchNodeDown{node="node1"}`' in text
    assert text.rstrip().splitlines()[-3:] == [
        "* classes within target: 1 of 2 (rows: 2 of 3)",
        "* culprit correct: 1 of 2",
        "* false alarms: 1",
    ]
    assert "they do not count toward the verdict" in text
    card.strict_targets = True
    assert "they count toward every verdict: --strict-targets" in render_markdown(card)


def test_of_alerts_one_rule_evaluation_fired_together_the_one_naming_the_fault_is_judged(
    tmp_path: Path,
) -> None:
    waiting = _alert("StormwatchRankStalled", 101.4, training_job="j", rank="0")
    faulted = _alert("StormwatchRankStalled", 101.4, training_job="j", rank="1")
    pm = _pm(30.0, rank="0").model_copy(update={"alertname": "StormwatchLossSpike"})
    row = score(_rank_kill(), _journal(), pm, ALL_OK, [waiting, faulted], tmp_path)
    assert (row.alert, row.time_to_detect_seconds) == ("StormwatchRankStalled", pytest.approx(1.4))
    assert (row.culprit, row.culprit_correct) == ({"rank": "1"}, True)
