"""Hang and straggler detectors over recorded gauge sequences (table-driven, no I/O)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stormwatch.agent import AgentConfigError
from stormwatch.agent.watch.detectors import (
    HANG,
    HANG_CLEARED,
    STRAGGLER,
    STRAGGLER_CLEARED,
    HangDetector,
    HangSettings,
    RankProgress,
    StepSample,
    StragglerDetector,
    StragglerSettings,
    collective_lag,
)
from stormwatch.agent.watch.events import EventLog

JOB = "job-a"

# --------------------------------------------------------------- stragglers
# Each step: {rank: (compute seconds, collective wait seconds)}, as the trainer's
# livemax gauges show them after that step.
SLOW_2 = [{0: (1.0, 0.55), 1: (1.02, 0.5), 2: (1.5, 0.02), 3: (0.98, 0.56)}] * 5
JITTER = [{0: (1.0, 0.1), 1: (1.1, 0.02), 2: (1.0, 0.1), 3: (1.05, 0.06)}] * 6
NOBODY_WAITS = [{0: (1.0, 0.0), 1: (1.5, 0.3), 2: (1.0, 0.0)}] * 5
INTERMITTENT = [
    {0: (1.0, 0.5), 1: (1.5, 0.0), 2: (1.0, 0.5)},
    {0: (1.0, 0.5), 1: (1.5, 0.0), 2: (1.0, 0.5)},
    {0: (1.0, 0.0), 1: (1.0, 0.0), 2: (1.0, 0.0)},
    {0: (1.0, 0.5), 1: (1.5, 0.0), 2: (1.0, 0.5)},
    {0: (1.0, 0.5), 1: (1.5, 0.0), 2: (1.0, 0.5)},
]
# Rank 1 waits a lot (for someone on another node) with normal compute.
WAITER_ONLY = [{0: (1.0, 0.1), 1: (1.0, 2.0), 2: (1.01, 0.1)}] * 6


@pytest.mark.parametrize(
    ("steps", "samples", "expected"),
    [
        pytest.param(SLOW_2, 3, {2: 3}, id="slow-rank-2-flagged-at-third-step"),
        pytest.param(SLOW_2, 5, {2: 5}, id="needs-n-samples"),
        pytest.param(JITTER, 3, {}, id="below-factor"),
        pytest.param(NOBODY_WAITS, 3, {}, id="peers-do-not-wait"),
        pytest.param(INTERMITTENT, 3, {}, id="not-consecutive"),
        pytest.param(WAITER_ONLY, 1, {}, id="waiting-rank-not-flagged"),
    ],
)
def test_fc14_straggler_detector_names_the_slow_rank_only(
    steps: list[dict[int, tuple[float, float]]], samples: int, expected: dict[int, int]
) -> None:
    detector = StragglerDetector(StragglerSettings(factor=1.2, samples=samples))
    flagged_at: dict[int, int] = {}
    for number, step in enumerate(steps, start=1):
        batch = [StepSample((JOB, r), float(number), c, w) for r, (c, w) in step.items()]
        for t in detector.observe(batch):
            assert t.kind == STRAGGLER, t
            flagged_at[t.key[1]] = number
        # Re-reading unchanged gauges (several scans per step) counts nothing new.
        assert detector.observe(batch) == []
    assert flagged_at == expected
    state = detector.flagged()
    assert {r for (_, r), on in state.items() if on} == set(expected)


def test_fc14_straggler_score_and_recovery() -> None:
    detector = StragglerDetector(StragglerSettings(samples=2))
    kinds = []
    for number, slow in enumerate([1.5, 1.5, 1.5, 1.0, 1.0], start=1):
        batch = [
            StepSample((JOB, 0), number, 1.0, 0.5 if slow > 1 else 0.0),
            StepSample((JOB, 1), number, slow, 0.0),
            StepSample((JOB, 2), number, 1.0, 0.5 if slow > 1 else 0.0),
        ]
        kinds += [(t.kind, t.key[1], number) for t in detector.observe(batch)]
        if number == 3:
            assert detector.scores()[(JOB, 1)] == pytest.approx(1.5)
            assert detector.scores()[(JOB, 0)] == pytest.approx(1.0 / 1.25)
    assert kinds == [(STRAGGLER, 1, 2), (STRAGGLER_CLEARED, 1, 4)]
    assert detector.flagged()[(JOB, 1)] is False


def test_fc14_ranks_of_other_jobs_are_not_peers() -> None:
    detector = StragglerDetector(StragglerSettings(samples=1))
    batch = [
        StepSample(("fast", 0), 1, 1.0, 0.5),
        StepSample(("slow", 0), 1, 3.0, 0.0),  # alone in its job on this node
    ]
    assert detector.observe(batch) == []
    assert detector.scores() == {}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"factor": 1.0}, "factor"), ({"samples": 0}, "samples")],
)
def test_straggler_settings_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(AgentConfigError, match=field):
        StragglerSettings(**kwargs)


# -------------------------------------------------------------------- hangs
def _run_hang(
    detector: HangDetector, scans: list[tuple[float, dict[int, tuple[float, float, bool]]]]
) -> list[tuple[float, str, int]]:
    """scans: (now, {rank: (heartbeat, step, alive)}) -> [(now, kind, rank)]."""
    out = []
    for now, ranks in scans:
        progress = [RankProgress((JOB, r), alive, hb, st) for r, (hb, st, alive) in ranks.items()]
        out += [(now, t.kind, t.key[1]) for t in detector.observe(now, progress)]
    return out


def _steady(
    until: float, step_seconds: float, ranks: tuple[int, ...] = (0, 1)
) -> list[tuple[float, dict[int, tuple[float, float, bool]]]]:
    scans = []
    t = 0.0
    while t <= until:
        scans.append((t, {r: (t, t / step_seconds, True) for r in ranks}))
        t += step_seconds
    return scans


# The thresholds of a site that configured floor 30 s, factor 10 (the defaults before
# issue 18: LEGACY): max(30, 10 x 1 s) = 30 s; rank 1 stops at t=10 and resumes at t=50.
LEGACY = HangSettings(floor_seconds=30.0, factor=10.0, warmup_seconds=30.0)
FAST_JOB = [
    *_steady(10, 1.0),
    (39.0, {0: (39.0, 39.0, True), 1: (10.0, 10.0, True)}),  # 29 s: not yet
    (41.0, {0: (41.0, 41.0, True), 1: (10.0, 10.0, True)}),  # 31 s: hung
    (45.0, {0: (45.0, 45.0, True), 1: (10.0, 10.0, True)}),  # still the same episode
    (50.0, {0: (50.0, 50.0, True), 1: (50.0, 11.0, True)}),  # progress: cleared
    (51.0, {0: (51.0, 51.0, True), 1: (51.0, 12.0, True)}),
]
# 5 s steps: threshold max(30, 50) = 50 s (LEGACY).
SLOW_JOB = [
    *_steady(50, 5.0),
    (95.0, {0: (95.0, 19.0, True), 1: (50.0, 10.0, True)}),  # 45 s: not yet
    (101.0, {0: (100.0, 20.0, True), 1: (50.0, 10.0, True)}),  # 51 s: hung
]
# A rank that exited is not hung, however old its heartbeat.
EXITED = [*_steady(5, 1.0), (100.0, {0: (5.0, 5.0, True), 1: (5.0, 5.0, False)})]


@pytest.mark.parametrize(
    ("scans", "settings", "expected", "episodes"),
    [
        pytest.param(
            FAST_JOB,
            LEGACY,
            [(41.0, HANG, 1), (50.0, HANG_CLEARED, 1)],
            {0: 0, 1: 1},
            id="floor-applies-then-clears-on-progress",
        ),
        pytest.param(SLOW_JOB, LEGACY, [(101.0, HANG, 1)], {0: 0, 1: 1}, id="factor-x-median"),
        pytest.param(
            FAST_JOB,
            HangSettings(floor_seconds=5.0, factor=2.0),
            [(39.0, HANG, 1), (50.0, HANG_CLEARED, 1)],
            {0: 0, 1: 1},
            id="configured-floor",
        ),
        pytest.param(
            EXITED, HangSettings(), [(100.0, HANG, 0)], {0: 1, 1: 0}, id="exited-not-hung"
        ),
    ],
)
def test_fc10_hang_fires_after_threshold_and_clears_on_progress(
    scans: list[tuple[float, dict[int, tuple[float, float, bool]]]],
    settings: HangSettings,
    expected: list[tuple[float, str, int]],
    episodes: dict[int, int],
) -> None:
    detector = HangDetector(settings)
    assert _run_hang(detector, scans) == expected
    assert {r: n for (_, r), n in detector.episodes().items()} == episodes


def test_fc10_hang_threshold_uses_the_jobs_median_step_time() -> None:
    detector = HangDetector(LEGACY)
    assert detector.threshold(JOB) == 30.0  # nothing measured yet: the floor
    _run_hang(detector, _steady(40, 4.0))
    assert detector.median_step_seconds(JOB) == pytest.approx(4.0)
    assert detector.threshold(JOB) == pytest.approx(40.0)


def _stalls_at(step_seconds: float, stop: float, settings: HangSettings | None = None) -> float:
    """Rank 1 of a steady two-rank job stops stepping at ``stop``; scanned every 0.5 s
    (rank 0 goes on), returns when the hang is detected."""
    detector = HangDetector(settings)
    scans = _steady(stop, step_seconds)
    t = stop
    while t < stop + 100 * max(step_seconds, 1.0):
        t += 0.5
        beat0 = (t // step_seconds) * step_seconds
        scans.append(
            (t, {0: (beat0, beat0 / step_seconds, True), 1: (stop, stop / step_seconds, True)})
        )
    hangs = [now for now, kind, rank in _run_hang(detector, scans) if kind == HANG and rank == 1]
    assert hangs, "no hang detected"
    return hangs[0] - stop


@pytest.mark.parametrize(
    ("step_seconds", "threshold"),
    [
        pytest.param(0.2, 5.0, id="sub-second-steps-the-floor"),
        pytest.param(1.0, 5.0, id="1s-steps-the-floor"),
        pytest.param(4.0, 12.0, id="4s-steps-3x-median"),
        pytest.param(120.0, 360.0, id="2-minute-steps-3x-median"),
    ],
)
def test_issue18_default_threshold_is_3x_median_step_with_a_5s_floor(
    step_seconds: float, threshold: float
) -> None:
    """The target of issue 18: a hang is detected within max(3 x median step, 5 s) (+ the
    scan interval), for sub-second and minute-long steps alike."""
    late = _stalls_at(step_seconds, stop=40 * step_seconds)
    assert threshold < late <= threshold + 0.5


def test_issue18_a_new_process_warms_up_before_the_short_threshold_applies() -> None:
    """A restarted rank (a new ``started_at``) gets ``warmup_seconds`` until its process has
    completed ``warmup_steps`` steps: a torchrun restart's imports and first steps are not
    a hang. After its warm-up, the job's threshold applies again."""
    settings = HangSettings()  # floor 5, factor 3, 3 warm-up steps, 60 s
    detector = HangDetector(settings)
    key = (JOB, 0)
    scans: list[tuple[float, list[RankProgress]]] = []
    for t in range(0, 21):  # the first process, 1 s steps, warm after 3 steps
        scans.append((float(t), [RankProgress(key, True, float(t), float(t), started_at=-1.0)]))
    for now, progress in scans:
        assert detector.observe(now, progress) == []
    assert detector.rank_threshold(key) == 5.0
    # restarted at t=25 (its last heartbeat t=20); it resumes at step 10 and steps only at t=70
    for t in range(25, 70):
        out = detector.observe(float(t), [RankProgress(key, True, 25.0, 20.0, started_at=25.0)])
        assert out == [], t  # 45 s without a step: warming up, not hung
        assert detector.warming_up(key)
    assert detector.rank_threshold(key) == 60.0
    assert [
        t.kind
        for t in detector.observe(86.0, [RankProgress(key, True, 25.0, 20.0, started_at=25.0)])
    ] == [HANG]
    for i, t in enumerate(range(90, 95)):  # steps again: 3 steps of this process end its warm-up
        detector.observe(float(t), [RankProgress(key, True, float(t), 21.0 + i, started_at=25.0)])
    assert not detector.warming_up(key)
    assert detector.rank_threshold(key) == 5.0
    assert detector.thresholds() == {key: 5.0}


def test_issue18_a_rank_rejoining_after_minutes_warms_up_from_its_own_start() -> None:
    """A new process that has not reported yet still carries its predecessor's heartbeat
    (the agent keeps a rank's last one): the soak's rank rejoining 2.5 minutes after its
    node was out was hung on arrival. Its warm-up counts from its own start: the threshold
    grows by the time from the inherited heartbeat to the start, back to normal once it
    reports."""
    detector = HangDetector()  # floor 5, factor 3, 3 warm-up steps, 60 s
    key = (JOB, 2)
    for t in range(0, 21):  # the first process, 1 s steps
        detector.observe(float(t), [RankProgress(key, True, float(t), float(t), started_at=-1.0)])
    assert detector.rank_threshold(key) == 5.0
    # its node is out; the rank rejoins at t=170 with the heartbeat of t=20
    for t in range(170, 230):
        out = detector.observe(float(t), [RankProgress(key, True, 20.0, 20.0, started_at=170.0)])
        assert out == [], t  # 60 s of its own warm-up, not 150 s of the predecessor's silence
    assert detector.thresholds() == {key: 150.0 + 60.0}
    hung = detector.observe(231.0, [RankProgress(key, True, 20.0, 20.0, started_at=170.0)])
    assert [t.kind for t in hung] == [HANG]  # still hung if its start-up outlasts a warm-up
    detector.observe(232.0, [RankProgress(key, True, 232.0, 21.0, started_at=170.0)])
    assert detector.rank_threshold(key) == 60.0  # it reported: its own heartbeat now


def test_issue18_a_job_without_step_marks_is_judged_at_the_warm_up_threshold() -> None:
    """No step marks (a job whose heartbeat is its collectives only): no step time to scale
    by, so the threshold stays ``warmup_seconds`` (60 s by default)."""
    detector = HangDetector()
    key = (JOB, 0)
    for t in range(0, 10):
        detector.observe(float(t), [RankProgress(key, True, float(t), None)])
    assert detector.rank_threshold(key) == 60.0
    assert detector.observe(69.0, [RankProgress(key, True, 9.0, None)]) == []
    assert [t.kind for t in detector.observe(70.0, [RankProgress(key, True, 9.0, None)])] == [HANG]


def test_fc10_a_second_hang_is_a_second_episode() -> None:
    detector = HangDetector(HangSettings(floor_seconds=5.0, factor=1.0, warmup_steps=1))
    scans = [
        *_steady(3, 1.0, ranks=(0,)),
        (10.0, {0: (3.0, 3.0, True)}),
        (11.0, {0: (11.0, 4.0, True)}),
        (20.0, {0: (11.0, 4.0, True)}),
    ]
    kinds = [kind for _, kind, _ in _run_hang(detector, scans)]
    assert kinds == [HANG, HANG_CLEARED, HANG]
    assert detector.episodes() == {(JOB, 0): 2}


def test_hang_settings_name_the_field() -> None:
    with pytest.raises(AgentConfigError, match="floor_seconds"):
        HangSettings(floor_seconds=0)


def test_fc10_collective_lag_names_the_rank_behind() -> None:
    counts = {(JOB, 0): 120.0, (JOB, 1): 117.0, (JOB, 2): 120.0, ("other", 5): 3.0}
    assert collective_lag(counts) == {
        (JOB, 0): 0.0,
        (JOB, 1): 3.0,
        (JOB, 2): 0.0,
        ("other", 5): 0.0,
    }


def test_event_log_appends_json_lines_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "state" / "events.jsonl"
    clock = iter([100.0, 200.0])
    log = EventLog(path, "node-x", clock=lambda: next(clock))
    log.record("rank_exit", JOB, 1, pid=42, exit_code=None)
    log.record(HANG, JOB, 2, age_seconds=31.0)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {
        "time": 100.0,
        "node": "node-x",
        "kind": "rank_exit",
        "job": JOB,
        "rank": 1,
        "pid": 42,
        "exit_code": None,
    }
    again = EventLog(path, "node-x")
    assert [e.kind for e in again.events()] == ["rank_exit", HANG]
    assert [e.rank for e in again.events(since=150.0)] == [2]
    assert again.events(kind="rank_exit", job="nope") == []


def test_fc10_a_rank_before_its_first_step_is_not_hung() -> None:
    detector = HangDetector(HangSettings(floor_seconds=1.0))
    # prometheus-client creates the labelled heartbeat gauge at 0 before the first set().
    progress = [RankProgress((JOB, 0), True, 0.0, 0.0), RankProgress((JOB, 1), True, None, None)]
    assert detector.observe(1000.0, progress) == []
    assert detector.hung() == {}


# ------------------------------------------------------- phases and heartbeats
def _beat(now: float, paused_until: float, *, heartbeat: float = 10.0) -> list[RankProgress]:
    """Rank 1 silent since ``heartbeat``, inside a phase until ``paused_until`` (0: none)."""
    return [
        RankProgress((JOB, 0), True, now, now, step_heartbeat=now),
        RankProgress(
            (JOB, 1),
            True,
            heartbeat,
            heartbeat,
            step_heartbeat=heartbeat,
            paused_until=paused_until,
        ),
    ]


@pytest.mark.parametrize(
    ("paused_until", "expected"),
    [
        pytest.param(0.0, [(100.0, HANG, 1)], id="no-phase-hung"),
        pytest.param(500.0, [], id="inside-the-phase-bound-not-hung"),
        pytest.param(90.0, [(100.0, HANG, 1)], id="past-the-phase-deadline-hung-again"),
    ],
)
def test_a_phase_excuses_a_silent_rank_until_its_deadline(
    paused_until: float, expected: list[tuple[float, str, int]]
) -> None:
    detector = HangDetector()
    out = []
    for now in (20.0, 100.0):
        progress = _beat(now, paused_until)
        out += [(now, t.kind, t.key[1]) for t in detector.observe(now, progress)]
    assert out == expected


@pytest.mark.parametrize("stage", ["rendezvous", "mesh", "parallelize", "checkpoint_load"])
def test_a_rank_stuck_in_a_start_up_stage_is_hung_at_its_deadline_and_named_by_it(
    stage: str,
) -> None:
    """No step yet: the stage's entry is the heartbeat, its deadline entry + bound (60 s)."""
    detector = HangDetector(HangSettings(floor_seconds=30.0))
    entered, deadline = 10.0, 70.0
    out = []
    for now in (30.0, 69.0, 71.0):
        progress = [
            RankProgress((JOB, 0), True, now, None),  # a peer that moved on
            RankProgress((JOB, 1), True, entered, None, paused_until=deadline, phase=stage),
        ]
        out += [(now, t.kind, t.key[1], t.details) for t in detector.observe(now, progress)]
    assert [(now, kind, rank) for now, kind, rank, _ in out] == [(71.0, HANG, 1)]
    details = out[0][3]
    assert details["phase"] == stage and details["phase_deadline"] == deadline
    assert details["step"] is None


def test_a_job_without_step_marks_is_judged_by_its_progress_heartbeat() -> None:
    """Zero-code jobs: only collectives advance the heartbeat; no step, no step heartbeat."""
    detector = HangDetector(LEGACY)
    scans = [(t, t) for t in range(0, 20)] + [(60.0, 19.0)]  # (now, progress heartbeat)
    out = []
    for now, beat in scans:
        progress = [RankProgress((JOB, 0), True, float(beat), None)]
        out += [(now, t.kind) for t in detector.observe(float(now), progress)]
    assert out == [(60.0, HANG)]
    assert detector.median_step_seconds(JOB) is None  # the floor alone applied


def test_step_times_come_from_the_step_heartbeat_not_the_progress_heartbeat() -> None:
    """Collectives advance the progress heartbeat between steps; 4 s steps stay 4 s."""
    detector = HangDetector()
    for n in range(0, 10):
        now = 4.0 * n + 3.0  # scans 3 s into each step: progress at now, step heartbeat 4n
        progress = [RankProgress((JOB, 0), True, now, float(n), step_heartbeat=4.0 * n)]
        detector.observe(now, progress)
    assert detector.median_step_seconds(JOB) == pytest.approx(4.0)
