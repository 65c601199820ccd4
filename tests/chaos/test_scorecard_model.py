"""The game-day scorecard has one model: what the suite writes, ``stormwatch plan`` loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.gameday.scorecard import (
    Scorecard,
    ScorecardRow,
    load_scorecard,
    write_scorecard,
)


def _card(tmp_path: Path) -> Scorecard:
    return Scorecard(
        suite_id="20260101T000000-suite-0001",
        suite_dir="experiments/suite",
        run_dir=str(tmp_path),
        started_at=1767225600.0,
        ended_at=1767226000.5,
        baselines={"0": "baseline-0"},
        rows=[
            ScorecardRow(
                file="01-kill.yaml",
                title="kill",
                experiment_id="e1",
                fault="kill_rank rank 1 (node0)",
                fault_kind="kill_rank",
                category="software_bug",
                status="completed",
                detected=True,
                alert="StormwatchRankStalled",
                time_to_detect_seconds=4.5,
                recovered=True,
                recovered_by="restart",
                time_to_recover_seconds=40.25,
                steps_lost=5,
                loss=True,
                checkpoint=True,
                faults_cleared=True,
                verdict="pass",
                experiment_dir=str(tmp_path / "experiments" / "e1"),
            ),
            ScorecardRow(file="02-freeze.yaml", title="freeze", status="aborted", verdict="fail"),
            ScorecardRow(file="03-later.yaml", title="later"),
        ],
    )


def test_the_scorecard_the_suite_writes_round_trips_through_the_model(tmp_path: Path) -> None:
    card = _card(tmp_path)
    _, path = write_scorecard(card, tmp_path / "suites" / card.suite_id)
    loaded = load_scorecard(path)
    assert loaded == card
    assert path.read_text() == loaded.model_dump_json(indent=2)


def test_a_row_status_that_no_experiment_has_is_refused_naming_the_field(tmp_path: Path) -> None:
    card = _card(tmp_path)
    _, path = write_scorecard(card, tmp_path)
    path.write_text(path.read_text().replace('"status": "aborted"', '"status": "exploded"'))
    with pytest.raises(ChaosError, match=r"rows\.1\.status"):
        load_scorecard(path)
