"""The trainer's control file model and its writers' helpers (agent, platforms, tests)."""

from __future__ import annotations

import json
import logging
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from stormwatch.faults.control_file import (
    ENTRY,
    POINTS,
    STAGES,
    CheckpointNow,
    ControlFile,
    Stage,
    arm,
    control_path,
    disarm,
    read_entries,
    write_entries,
)
from stormwatch.telemetry.phases import STARTUP_STAGES


def _raw(path: Path) -> dict:
    return json.loads(path.read_text())


def test_arm_keeps_other_entries_and_adds_an_equal_entry_once(tmp_path: Path) -> None:
    path = control_path(tmp_path / "control", 3)
    assert path.name == "rank3.json"
    slow = ENTRY.validate_python({"point": "slow_step", "seconds": 0.5, "expires_at": 10.0})
    arm(path, slow)
    arm(path, CheckpointNow(point="checkpoint_now", requested_at=1.0))
    stamp = path.stat().st_mtime_ns
    arm(path, slow)  # the same entry again: one effect, the file is not rewritten
    assert path.stat().st_mtime_ns == stamp
    assert _raw(path) == {
        "faults": [
            {"point": "slow_step", "seconds": 0.5, "expires_at": 10.0},
            {"point": "checkpoint_now", "requested_at": 1.0},
        ]
    }


def test_replacing_a_point_drops_its_older_entries_only(tmp_path: Path) -> None:
    path = control_path(tmp_path, 0)
    arm(path, ENTRY.validate_python({"point": "error_at_step", "step": 3}))
    arm(path, CheckpointNow(point="checkpoint_now", requested_at=1.0))
    arm(path, CheckpointNow(point="checkpoint_now", requested_at=2.0), replacing="checkpoint_now")
    assert [e.model_dump(exclude_none=True) for e in read_entries(path)] == [
        {"point": "error_at_step", "step": 3},
        {"point": "checkpoint_now", "requested_at": 2.0},
    ]


def test_disarm_removes_exactly_that_entry_and_the_file_with_the_last(tmp_path: Path) -> None:
    path = control_path(tmp_path, 0)
    hang = ENTRY.validate_python({"point": "collective_hang", "expires_at": 5.0})
    other = ENTRY.validate_python({"point": "collective_hang", "expires_at": 6.0})
    write_entries(path, [hang, other])
    disarm(path, hang)
    disarm(path, hang)  # idempotent
    assert read_entries(path) == [other]
    disarm(path, other)
    assert not path.exists()


def test_a_writer_drops_what_the_trainer_would_refuse_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = control_path(tmp_path, 0)
    path.write_text(
        json.dumps({"faults": [{"point": "slow_step", "seconds": -1}, {"point": "checkpoint_now",
                                                                       "requested_at": 1}]})
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        kept = read_entries(path)
    assert [e.point for e in kept] == ["checkpoint_now"]
    assert "dropping entry" in caplog.text
    path.write_text("[1, 2")
    with caplog.at_level(logging.WARNING):
        assert read_entries(path) == []
    assert "unreadable" in caplog.text
    assert read_entries(tmp_path / "missing.json") == []


def test_every_point_is_one_model_and_the_file_forbids_unknown_keys() -> None:
    examples = {
        "slow_step": {"seconds": 1.0},
        "collective_delay": {"seconds": 1.0, "op": "all_reduce", "mesh_dim": "tp"},
        "collective_hang": {},
        "error_at_step": {"step": 2},
        "checkpoint_now": {"requested_at": 1.0},
        "kill_at_step": {"step": 6, "attempt": 0},
        "checkpoint_kill": {"phase": "before_shards", "step": 4},
        "freeze_at_step": {"step": 1, "seconds": 8.0},
        "stage_hang": {"stage": "rendezvous"},
        "stage_kill": {"stage": "parallelize"},
        "stage_freeze": {"stage": "mesh", "seconds": 8.0},
    }
    assert set(examples) == set(POINTS)
    for point, fields in examples.items():
        assert ENTRY.validate_python({"point": point, **fields}).point == point
    with pytest.raises(ValidationError):
        ControlFile.model_validate({"faults": [], "extra": 1})
    with pytest.raises(ValidationError):
        ENTRY.validate_python({"point": "kill_at_step", "step": 1, "attempt": -1})


def test_stage_points_name_exactly_the_start_up_stages_of_the_telemetry_api() -> None:
    assert typing.get_args(Stage) == STAGES == STARTUP_STAGES
    with pytest.raises(ValidationError):
        ENTRY.validate_python({"point": "stage_hang", "stage": "training"})
    with pytest.raises(ValidationError):
        ENTRY.validate_python({"point": "stage_freeze", "stage": "mesh", "seconds": 0})
