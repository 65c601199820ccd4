"""The agent's event log has one model: what the agent writes, the API and readers parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stormwatch.agent.watch.detectors import HANG, HANG_CLEARED, STRAGGLER, STRAGGLER_CLEARED
from stormwatch.agent.watch.events import (
    EventLog,
    RankExitEvent,
    RankHangClearedEvent,
    RankHangEvent,
    RankStragglerClearedEvent,
    RankStragglerEvent,
    parse_agent_event,
    read_agent_events,
)

JOB = "job-a"


def _write_what_the_agent_writes(path: Path) -> EventLog:
    """One event of each kind with the details the agent's callers pass, in their order."""
    clock = iter(float(t) for t in range(100, 200))
    log = EventLog(path, "node-x", clock=lambda: next(clock))
    log.record(
        "rank_exit",
        JOB,
        1,
        pid=42,
        clean=False,
        replaced=False,
        exit_code=-9,
        exit_signal="SIGKILL",
        reason="signal",
    )
    log.record(
        HANG,
        JOB,
        2,
        pid=43,
        heartbeat=90.5,
        age_seconds=31.25,
        threshold_seconds=30.0,
        median_step_seconds=0.5,
        step=12.0,
        collective_calls=120.0,
        collective_lag=3.0,
        behind_rank=2,
        diagnostics="/state/diagnostics/20250101T000000",
    )
    log.record(HANG_CLEARED, JOB, 2, pid=43, reason="progress", step=13.0)
    straggler = {
        "step": 20.0,
        "score": 1.5,
        "compute_seconds": 1.5,
        "wait_seconds": 0.02,
        "peers_median_compute_seconds": 1.0,
        "peers_median_wait_seconds": 0.5,
    }
    log.record(STRAGGLER, JOB, 3, pid=44, **straggler)
    log.record(STRAGGLER_CLEARED, JOB, 3, pid=44, **straggler)
    log.record(STRAGGLER_CLEARED, JOB, 3, pid=None, reason="gone")
    return log


def test_the_writer_writes_the_same_bytes_as_before_the_model(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _write_what_the_agent_writes(path)
    head = '{"time": %s, "node": "node-x", "kind": "%s", "job": "job-a", "rank": %d, '
    straggler = (
        '"step": 20.0, "score": 1.5, "compute_seconds": 1.5, "wait_seconds": 0.02, '
        '"peers_median_compute_seconds": 1.0, "peers_median_wait_seconds": 0.5}'
    )
    assert path.read_text().splitlines() == [
        head % ("100.0", "rank_exit", 1) + '"pid": 42, "clean": false, "replaced": false, '
        '"exit_code": -9, "exit_signal": "SIGKILL", "reason": "signal"}',
        head % ("101.0", "rank_hang", 2) + '"pid": 43, "heartbeat": 90.5, "age_seconds": 31.25, '
        '"threshold_seconds": 30.0, "median_step_seconds": 0.5, "step": 12.0, '
        '"collective_calls": 120.0, "collective_lag": 3.0, "behind_rank": 2, '
        '"diagnostics": "/state/diagnostics/20250101T000000"}',
        head % ("102.0", "rank_hang_cleared", 2) + '"pid": 43, "reason": "progress", "step": 13.0}',
        head % ("103.0", "rank_straggler", 3) + '"pid": 44, ' + straggler,
        head % ("104.0", "rank_straggler_cleared", 3) + '"pid": 44, ' + straggler,
        head % ("105.0", "rank_straggler_cleared", 3) + '"pid": null, "reason": "gone"}',
    ]


def test_every_event_the_agent_writes_round_trips_through_the_model(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = _write_what_the_agent_writes(path)
    lines = path.read_text().splitlines()
    events = read_agent_events(path)
    assert [type(e) for e in events] == [
        RankExitEvent,
        RankHangEvent,
        RankHangClearedEvent,
        RankStragglerEvent,
        RankStragglerClearedEvent,
        RankStragglerClearedEvent,
    ]
    assert [json.dumps(e.to_record()) for e in events] == lines
    assert events == log.events()  # the API serves what the file holds
    assert events == EventLog(path, "node-x").events()  # and what a restarted agent reloads


def test_readers_keep_unknown_keys_and_skip_lines_that_are_not_events(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        '{"time": 1, "node": "n", "kind": "rank_hang", "job": "j", "rank": 0, "later": [1]}\n'
        '{"time": 2, "node": "n", "kind": "rank_reborn", "job": "j", "rank": 0}\n'
        '{"time": 3, "node": "n", "kind": "rank_exit", "job": "j"}\n'
        "\n"
        '{"time": 4, "node": "n", "kind": "rank_ex'
    )
    [hang] = read_agent_events(path)
    assert isinstance(hang, RankHangEvent) and hang.time == 1.0 and hang.age_seconds is None
    assert hang.to_record() == {
        "time": 1.0,
        "node": "n",
        "kind": "rank_hang",
        "job": "j",
        "rank": 0,
        "later": [1],
    }
    assert hang.details() == {"job": "j", "rank": 0, "later": [1]}


def test_the_writer_refuses_a_detail_the_model_does_not_declare(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl", "node-x")
    with pytest.raises(ValueError, match="unknown detail"):
        log.record("rank_exit", JOB, 0, pid=1, exit_cod=3)
    with pytest.raises(ValueError):
        log.record("rank_reborn", JOB, 0)
    assert not (tmp_path / "events.jsonl").exists() and log.events() == []


def test_a_line_parses_as_the_kind_it_names() -> None:
    event = parse_agent_event(
        '{"time": 5.5, "node": "n", "kind": "rank_exit", "job": "j", "rank": 3, "exit_code": 1}'
    )
    assert event == RankExitEvent(time=5.5, node="n", job="j", rank=3, exit_code=1)
