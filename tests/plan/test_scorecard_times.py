"""``stormwatch plan`` takes per-category detect/recover times from the latest game-day scorecard,
and says when it falls back to the documented defaults.

The command runs in-process, through the console script's entry point
(``stormwatch.cli.main``: exit status and stderr as a process's); tests/plan/test_cli.py
runs it as a real process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stormwatch.chaos.gameday.scorecard import Scorecard, ScorecardRow, write_scorecard
from stormwatch.plan import load_failure_table
from stormwatch.plan.errors import InvalidPlanInput
from stormwatch.plan.fromscorecard import read_scorecard_times
from stormwatch.plan.inputs import PlanSettings


def _row(file: str, kind: str | None, category: str | None, **times: float | None) -> ScorecardRow:
    ttd, ttr = times.get("ttd"), times.get("ttr")
    return ScorecardRow(
        file=file,
        title=file,
        fault_kind=kind,
        category=category,
        detected=ttd is not None,
        time_to_detect_seconds=ttd,
        time_to_recover_seconds=ttr,
        verdict="pass",
    )


def _write(run_dir: Path, suite_id: str, rows: list[ScorecardRow]) -> Path:
    card = Scorecard(
        suite_id=suite_id, suite_dir="experiments/suite", run_dir=str(run_dir), started_at=0.0
    )
    card.rows = rows
    _, path = write_scorecard(card, run_dir / "suites" / suite_id)
    return path


ROWS = [
    _row("01-rank-kill.yaml", "kill_rank", "software_bug", ttd=4.0, ttr=40.0),
    _row("02-rank-kill-again.yaml", "kill_rank", "software_bug", ttd=6.0, ttr=50.0),
    _row("08-gpu-xid-79.yaml", "gpu_xid", "faulty_gpu", ttd=10.0, ttr=None),
    # recovered when its fault was removed (no restart): its time is the fault's duration
    _row("03-partition.yaml", "partition", "network_switch_cable", ttd=30.0, ttr=75.0).model_copy(
        update={"recovered": True, "recovered_by": "fault removed"}
    ),
    _row("06-slow-rank.yaml", "trainer_fault", None, ttd=130.0, ttr=None),
]


def test_measured_times_are_the_mean_per_category_and_rows_without_recovery_are_skipped(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "run", "20260101T000000-suite-aaaa", ROWS)

    measured = read_scorecard_times(path, load_failure_table())

    assert set(measured.times) == {"software_bug"}
    times = measured.times["software_bug"]
    assert times.detect_s == pytest.approx(5.0)
    assert times.restart_s == pytest.approx((36.0 + 44.0) / 2)  # recover - detect, averaged
    assert times.source == "scorecard 20260101T000000-suite-aaaa (2 experiments)"
    assert any("08-gpu-xid-79.yaml: no recovery time" in s for s in measured.skipped)
    assert any("03-partition.yaml: no recovery time" in s for s in measured.skipped)
    assert any("06-slow-rank.yaml" in s and "no failure category" in s for s in measured.skipped)


def test_a_scorecard_with_an_unknown_category_is_rejected_naming_it(tmp_path: Path) -> None:
    bad = [_row("x.yaml", "kill_rank", "gremlins", ttd=1.0, ttr=2.0)]
    path = _write(tmp_path / "run", "20260101T000000-suite-bbbb", bad)
    with pytest.raises(InvalidPlanInput, match="unknown category 'gremlins'"):
        read_scorecard_times(path, load_failure_table())


def test_plan_uses_the_latest_scorecard_under_the_run_dir(tmp_path: Path, stormwatch) -> None:
    run_dir = tmp_path / "run"
    _write(
        run_dir,
        "20250101T000000-suite-old0",
        [_row("a.yaml", "kill_rank", "software_bug", ttd=99.0, ttr=199.0)],
    )
    latest = _write(run_dir, "20260101T000000-suite-new0", ROWS)
    out = tmp_path / "plan"

    proc = stormwatch(
        "plan", "--gpus", "16384", "--replicas", "20", "--run-dir", str(run_dir), "--out", str(out)
    )

    assert proc.returncode == 0, proc.stderr
    assert f"from {latest} for software_bug" in " ".join(proc.stdout.split())
    report = json.loads((out / "report.json").read_text())
    by_id = {c["id"]: c for c in report["categories"]}
    assert by_id["software_bug"]["detect_s"] == pytest.approx(5.0)
    assert by_id["software_bug"]["source"].startswith("scorecard 20260101T000000-suite-new0")
    # Categories the scorecard does not measure keep the documented defaults.
    defaults = PlanSettings(gpus=1)
    assert by_id["faulty_gpu"]["detect_s"] == defaults.detect_s
    assert by_id["faulty_gpu"]["source"] == "default"


def test_plan_without_a_scorecard_says_it_uses_the_documented_defaults(
    tmp_path: Path, stormwatch
) -> None:
    proc = stormwatch("plan", "--gpus", "1024", "--replicas", "20", "--run-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "no game-day scorecard under" in proc.stdout
    assert "documented defaults" in proc.stdout


def test_a_latest_scorecard_that_measured_nothing_falls_back_to_the_defaults(
    tmp_path: Path,
    stormwatch,
) -> None:
    run_dir = tmp_path / "run"
    nothing = [_row("06-slow-rank.yaml", "trainer_fault", None, ttd=130.0, ttr=None)]
    path = _write(run_dir, "20260101T000000-suite-cccc", nothing)
    proc = stormwatch("plan", "--gpus", "1024", "--replicas", "20", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "measured no failure category" in proc.stdout and "documented defaults" in proc.stdout
    explicit = stormwatch("plan", "--gpus", "1024", "--scorecard", str(path))
    assert explicit.returncode == 2 and "nothing to plan with" in explicit.stderr


def test_plan_with_a_missing_scorecard_file_exits_2_naming_the_option(
    tmp_path: Path, stormwatch
) -> None:
    proc = stormwatch("plan", "--gpus", "8", "--scorecard", str(tmp_path / "nope.json"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--scorecard" in proc.stderr and "Traceback" not in proc.stderr


def _card(tmp_path: Path, **change: object) -> dict[str, object]:
    path = _write(tmp_path / "good", "20260101T000000-suite-cccc", ROWS[:1])
    card = json.loads(path.read_text())
    card["rows"][0].update(change)
    return card


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "does not exist; give a RUN_DIR/suites/<suite-id>/scorecard.json"),
        ("{bad", "not a scorecard written by `stormwatch chaos suite` (file: Invalid JSON"),
        ("[]", "(file: Input should be an object)"),
        ("{}", "suite_id: Field required"),
        (
            {"time_to_detect_seconds": -5.0},
            "rows.0.time_to_detect_seconds: Input should be greater",
        ),
        (
            {"time_to_recover_seconds": -1.0},
            "rows.0.time_to_recover_seconds: Input should be greater",
        ),
        ({"steps_lost": -3}, "rows.0.steps_lost: Input should be greater than or equal to 0"),
        (
            {"time_to_detect_seconds": "soon"},
            "rows.0.time_to_detect_seconds: Input should be a valid",
        ),
        ({"mood": "great"}, "rows.0.mood: Extra inputs are not permitted"),
        ({"category": "gremlins"}, "unknown category 'gremlins'"),
    ],
    ids=[
        "missing",
        "not-json",
        "a-list",
        "empty-object",
        "negative-detect",
        "negative-recover",
        "negative-steps-lost",
        "time-not-a-number",
        "unknown-key",
        "unknown-category",
    ],
)
def test_a_bad_scorecard_file_exits_2_with_one_line_naming_the_field(
    tmp_path: Path, stormwatch, content: object, said: str
) -> None:
    path = tmp_path / "scorecard.json"
    if isinstance(content, dict):
        path.write_text(json.dumps(_card(tmp_path, **content)))
    elif isinstance(content, str):
        path.write_text(content)
    out = tmp_path / "plan"
    proc = stormwatch("plan", "--gpus", "8", "--scorecard", str(path), "--out", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in proc.stderr and str(path) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "errors.pydantic.dev" not in proc.stderr
    assert not out.exists()
