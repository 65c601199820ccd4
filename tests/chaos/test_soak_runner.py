"""The soak's stages on a stand-in lab and clock (no processes): start, planned restart from a
checkpoint, shrink and regrowth, end, settle, count; what a stage that does not happen does;
the settings' checks and the report's files. The real thing: tests/chaos/test_soak_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.soak.report import load_report, render_markdown
from stormwatch.chaos.soak.runner import SoakClock, SoakRunner, job_name_of, new_soak_id
from stormwatch.chaos.soak.settings import EVAL_BATCHES, SoakSettings
from stormwatch.clients.prometheus import Series
from stormwatch.errors import ConfigError
from stormwatch.lab import JobSpec
from stormwatch.telemetry.events import CheckpointEvent, StartEvent, StepEvent

T0 = 1_767_225_600.0
#: Seconds a stand-in step takes, and how long a start of the workers takes to log.
STEP_SECONDS = 0.5
STARTUP_SECONDS = 3.0


class FakeClock:
    def __init__(self) -> None:
        self.now = T0
        self.lab: StandInLab | None = None

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.lab is not None:
            self.lab.tick(self.now)

    def clock(self) -> SoakClock:
        return SoakClock(wall=lambda: self.now, monotonic=lambda: self.now - T0, sleep=self.sleep)


class StandInPrometheus:
    def __init__(self, firing: list[Series]) -> None:
        self.firing = firing
        self.queries: list[str] = []

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> list[Series]:
        self.queries.append(expr)
        if 'alertstate="firing"' in expr:
            return [s for s in self.firing if any(start <= t <= end for t, _ in s.points)]
        if "phase" in expr:  # one evaluation pause of 6 s, 50 s in
            return [Series({}, tuple((T0 + 50 + i, T0 + 1850.0) for i in range(6)))]
        return []

    def query(self, expr: str, *, at: float | None = None) -> list[object]:
        raise AssertionError("not used")

    def alerts(self) -> list[object]:
        raise AssertionError("not used")


class StandInLab:
    """Two nodes of one rank; the worker group's rank 0 logs starts, steps and checkpoints as
    a real one would, ``STEP_SECONDS`` a step, ``STARTUP_SECONDS`` after each (re)start."""

    def __init__(self, tmp_path: Path, clock: FakeClock, firing: list[Series], resume: bool = True):
        self.run_dir = tmp_path / "run"
        self.prometheus = StandInPrometheus(firing)
        self.evaluation_interval = 1.0
        self.clock = clock
        self.resume = resume
        self.log_dir = self.run_dir / "jobs" / "soak" / "logs"
        self.nodes_up: list[str] = []
        self.step = 0
        self.checkpoint = 0
        self.every = 1
        self.next_at: float | None = None
        self.calls: list[str] = []

    def _write(self, event: object) -> None:
        with (self.log_dir / "rank0.jsonl").open("a") as handle:
            handle.write(event.to_line() + "\n")  # type: ignore[attr-defined]

    def _group_start(self) -> None:
        at = self.clock.now + STARTUP_SECONDS
        resumed = self.checkpoint if self.checkpoint and self.resume else None
        self.step = resumed or 0
        self._write(StartEvent(time=at, world_size=len(self.nodes_up), resumed_from_step=resumed))
        self.next_at = at + STEP_SECONDS

    def tick(self, now: float) -> None:
        while self.nodes_up and self.next_at is not None and self.next_at <= now:
            self.step += 1
            self._write(StepEvent(time=self.next_at, step=self.step, loss=1.0))
            if self.step % self.every == 0:
                self.checkpoint = self.step
                self._write(CheckpointEvent(time=self.next_at, step=self.step))
            self.next_at += STEP_SECONDS

    def start(self, spec: JobSpec) -> Path:
        self.calls.append("start")
        assert spec.min_nodes == 1 and "--eval-every" in spec.extra_args
        self.every = spec.checkpoint_every
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.nodes_up = ["node0", "node1"]
        self._group_start()
        return self.log_dir

    def stop(self, name: str) -> None:
        self.calls.append("stop")
        self.nodes_up = []

    def nodes(self, name: str) -> list[str]:
        return ["node0", "node1"]

    def leave(self, name: str, node: str) -> int | None:
        self.calls.append(f"leave {node}")
        self.nodes_up.remove(node)
        self._group_start()
        return -15

    def rejoin(self, name: str, node: str) -> None:
        self.calls.append(f"rejoin {node}")
        self.nodes_up.append(node)
        self._group_start()

    def ended(self, name: str) -> bool:
        return not self.nodes_up


SETTINGS = SoakSettings(
    minutes=2, checkpoint_every=5, eval_every=20, eval_seconds=6, settle_seconds=10, wait_seconds=60
)


def _soak(tmp_path: Path, firing: list[Series], **lab: bool) -> tuple[SoakRunner, StandInLab]:
    clock = FakeClock()
    stand_in = StandInLab(tmp_path, clock, firing, **lab)
    clock.lab = stand_in
    runner = SoakRunner(
        SETTINGS, stand_in, soak_id="20260101T000000-soak-0001", clock=clock.clock()
    )
    return runner, stand_in


def _stalled(*offsets: float) -> Series:
    labels = {"__name__": "ALERTS", "alertname": "StormwatchRankStalled", "alertstate": "firing"}
    return Series({**labels, "rank": "1"}, tuple((T0 + o, 1.0) for o in offsets))


def test_a_soak_restarts_resizes_ends_and_counts_nothing_when_nothing_fired(tmp_path) -> None:
    runner, lab = _soak(tmp_path, [])
    report = runner.run()
    assert lab.calls == ["start", "stop", "start", "leave node1", "rejoin node1", "stop"]
    assert report.verdict == "pass" and report.problems == [] and report.fired == []
    assert report.world_sizes == [2, 2, 1, 2]
    assert report.resumed_from[0] is None and all(report.resumed_from[1:])
    restart, resize, end = (report.of_kind(k) for k in ("restart", "resize", "end"))
    assert restart[0].at - T0 >= SETTINGS.seconds / 3  # not before a third of the soak
    assert "resumed from the checkpoint of step" in restart[-1].detail
    assert resize[0].at - T0 >= SETTINGS.seconds * 2 / 3
    assert [e.detail.split(" ")[0] for e in resize] == [
        "node1",
        "node1",
        "shrunk",
        "node1",
        "grown",
    ]
    rejoin_wait = resize[3].at - resize[2].at
    assert rejoin_wait >= SETTINGS.rejoin_after - STARTUP_SECONDS
    assert end[0].at - T0 >= SETTINGS.seconds
    assert report.window_end is not None
    assert report.window_end - end[0].at >= SETTINGS.settle_seconds
    assert len(report.of_kind("checkpoint")) >= 3
    (pause,) = report.of_kind("eval")
    assert (pause.at - T0, pause.seconds) == (50, 6)
    assert sum('alertstate="firing"' in q for q in lab.prometheus.queries) == 1


def test_an_alert_of_the_soak_fails_it_and_is_placed_against_the_restart(tmp_path) -> None:
    runner, _ = _soak(tmp_path, [_stalled(42, 43, 44, 81, 82)])
    report = runner.run()
    assert report.verdict == "fail"
    (alert,) = report.fired
    assert alert.alertname == "StormwatchRankStalled" and alert.labels == {"rank": "1"}
    assert alert.preceding is not None and alert.preceding.kind == "restart"
    assert alert.firing_seconds == 5 and alert.episodes == 2
    assert [s.nearest.kind for s in alert.stretches if s.nearest] == ["restart", "resize"]
    md, js = runner.save()
    assert load_report(Path(js)) == report
    text = Path(md).read_text()
    assert "**1 alert fired**" in text and "| StormwatchRankStalled | rank=1 |" in text
    assert "restart (" in text
    assert "* StormwatchRankStalled (rank=1) fired 2 times:" in text


def test_a_restart_that_does_not_resume_is_a_problem_and_the_job_is_stopped(tmp_path) -> None:
    runner, lab = _soak(tmp_path, [], resume=False)
    report = runner.run()
    assert report.verdict == "fail"
    assert report.problems == [
        "the planned restart started afresh instead of resuming a checkpoint"
    ]
    assert lab.calls == ["start", "stop", "start", "stop"]  # stopped after the problem
    stopped = report.of_kind("end")[-1].at
    assert report.window_end is not None  # the stop's alerts are waited for, too
    assert report.window_end - stopped >= SETTINGS.settle_seconds
    assert report.of_kind("end")[-1].detail == "the soak stopped early: the job is stopped"
    assert "## Problems" in render_markdown(report)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"minutes": 0}, "minutes"),
        ({"minutes": float("nan")}, "minutes"),
        ({"checkpoint_every": 0}, "checkpoint_every"),
        ({"eval_seconds": -1}, "eval_seconds"),
        ({"restart_at": 0.7, "resize_at": 0.5}, "restart_at"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_bad_settings_name_the_field(values: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"soak settings: .*{field}"):
        SoakSettings(**values)  # type: ignore[arg-type]


def test_settings_give_the_trainer_its_evaluation_options() -> None:
    settings = SoakSettings(eval_every=50, eval_seconds=20)
    assert settings.trainer_args() == (
        "--eval-every", "50", "--eval-batches", str(EVAL_BATCHES), "--eval-delay", "5",
    )  # fmt: skip
    assert SoakSettings(eval_every=0).trainer_args() == ()
    assert SoakSettings(minutes=24).rejoin_after == 120


def test_the_job_is_named_after_the_soak_and_is_a_valid_job_name() -> None:
    soak_id = new_soak_id(T0)
    assert soak_id.startswith("20260101T000000-soak-")
    name = job_name_of(soak_id)
    assert name.startswith("soak-20260101t000000-") and JobSpec(name=name).name == name


def test_a_report_that_is_not_one_is_refused(tmp_path) -> None:
    path = tmp_path / "soak.json"
    path.write_text('{"soak_id": 1}')
    with pytest.raises(ChaosError, match="not a report written by `stormwatch chaos soak`"):
        load_report(path)
