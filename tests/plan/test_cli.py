"""``stormwatch plan``: writes the report files and exits 0; bad input exits 2.

A real process for the report and for one mistake (the console script's exit status and
stderr); the other cases call the same entry point, ``stormwatch.cli.main``, in-process
(each process spent seconds importing the planner, numpy and the chaos package)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import stormwatch.plan as plan

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _stormwatch(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from stormwatch.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_plan_writes_report_md_json_and_pngs(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    proc = _stormwatch("plan", "--gpus", "16384", "--replicas", "20", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "job MTTF 3.09 h" in proc.stdout
    assert "in-memory checkpoints" in proc.stdout
    for name in ("ettr_vs_interval.png", "ettr_vs_gpus.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["gpus"] == 16384
    assert report["scenarios"][0]["name"] == "baseline"
    md = (out / "report.md").read_text()
    assert "Daly" in md and "9,600 GPUs" in md and "![ettr_vs_gpus](ettr_vs_gpus.png)" in md


def test_plan_rejects_bad_input_with_a_clear_message_and_exit_2(stormwatch) -> None:
    proc = _stormwatch("plan", "--gpus", "0")
    assert proc.returncode == 2
    assert "gpus: Input should be greater than 0" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = stormwatch("plan", "--gpus", "8", "--detect", "gremlins=3")
    assert proc.returncode == 2 and "unknown category 'gremlins'" in proc.stderr
    proc = stormwatch("plan", "--gpus", "8", "--detect", "nic")
    assert proc.returncode == 2 and "--detect: expected CATEGORY=SECONDS" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "inf"], "error: --interval: Input should be a finite number (got inf)"),
        (["--interval", "0"], "error: --interval: Input should be greater than 0 (got 0.0)"),
        (["--checkpoint-write", "inf"], "error: --checkpoint-write: Input should be a finite"),
        (["--in-memory-write", "inf"], "error: --in-memory-write: Input should be a finite"),
        (["--restart", "inf"], "error: --restart: Input should be a finite number"),
        (["--detect-time", "inf"], "error: --detect-time: Input should be a finite number"),
        (["--days", "nan"], "error: --days: Input should be a finite number"),
    ],
)
def test_plan_rejects_non_finite_and_out_of_range_times_naming_the_option(
    stormwatch, args: list[str], message: str
) -> None:
    proc = stormwatch("plan", "--gpus", "16", "--no-scorecard", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and "plan settings" not in proc.stderr


def test_plan_says_a_rates_file_is_empty_and_what_it_must_hold(tmp_path: Path, stormwatch) -> None:
    rates = tmp_path / "rates.yaml"
    rates.write_text("")
    proc = stormwatch("plan", "--gpus", "8", "--no-scorecard", "--rates", str(rates))
    assert proc.returncode == 2, proc.stderr
    assert f"{rates}: the failure table is empty; it must be a YAML mapping" in proc.stderr
    assert "categories" in proc.stderr and "Traceback" not in proc.stderr


def test_plan_names_a_rates_file_that_is_not_utf8_instead_of_a_traceback(
    tmp_path: Path, stormwatch
) -> None:
    rates = tmp_path / "rates.yaml"
    rates.write_bytes(b"\x89\xd7\x00binary")
    proc = stormwatch("plan", "--gpus", "8", "--no-scorecard", "--rates", str(rates))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{rates}: cannot read failure table" in proc.stderr


def test_plan_with_a_period_of_many_mttfs_reports_zero_ettr_instead_of_overflowing(
    stormwatch,
) -> None:
    """math.expm1 raises OverflowError (it does not return inf) for a huge interval/MTTF."""
    proc = stormwatch(
        "plan", "--gpus", "8", "--no-scorecard", "--replicas", "2", "--interval", "1e308"
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


def test_public_api_is_what_all_lists() -> None:
    public = {n for n in vars(plan) if not n.startswith("_")}
    modules = {"cli", "errors", "fromscorecard", "inputs", "model", "montecarlo", "planner", "plots",
               "postmortems", "report", "whatif"}  # fmt: skip
    assert public - modules == set(plan.__all__)


def test_plan_table_shows_young_and_daly_intervals_with_their_sources(
    tmp_path: Path, monkeypatch, stormwatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    proc = stormwatch("plan", "--gpus", "16384", "--replicas", "20", "--no-scorecard",
                       "--out", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    baseline = json.loads((tmp_path / "report.json").read_text())["scenarios"][0]
    [row] = [line for line in proc.stdout.splitlines() if line.startswith("│ baseline")]
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    header = next(line for line in proc.stdout.splitlines() if "scenario" in line)
    names = [cell.strip() for cell in header.split("┃")[1:-1]]
    assert cells[names.index("Young min")] == f"{baseline['young_interval_s'] / 60:.1f}"
    assert cells[names.index("Daly min")] == f"{baseline['daly_interval_s'] / 60:.1f}"
    assert "Young = Young (1974) sqrt(2 δ MTTF)" in proc.stdout
    assert "Daly = Daly (2006) higher-order estimate" in proc.stdout


def test_plan_per_category_flags_name_the_flag_the_valid_categories_and_the_fix(stormwatch) -> None:
    proc = stormwatch("plan", "--gpus", "8", "--detect", "bogus=5")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--detect: unknown category 'bogus' (valid: faulty_gpu, " in proc.stderr
    assert "e.g. --detect software_bug=30" in proc.stderr
    proc = stormwatch("plan", "--gpus", "8", "--recover", "software_bug=-1")
    assert proc.returncode == 2
    assert "--recover: software_bug=-1: seconds must be a finite number >= 0" in proc.stderr


def test_plan_from_postmortems_says_where_its_times_came_from(tmp_path: Path, stormwatch) -> None:
    d = tmp_path / "experiments" / "a"
    d.mkdir(parents=True)
    (d / "postmortem.json").write_text(
        json.dumps(
            {
                "experiment_id": "a", "title": "a", "status": "completed",
                "hypothesis_held": True, "rollbacks_ok": True, "fault_kind": "kill_rank",
                "time_to_detect_seconds": 2.0, "time_to_recover_seconds": 14.0,
            }
        )
    )  # fmt: skip
    proc = stormwatch("plan", "--gpus", "8", "--from-postmortems", str(tmp_path), columns=300)
    assert proc.returncode == 0, proc.stderr
    assert (
        f"detect/recover times: measured by 1 post-mortem(s) under {tmp_path} for software_bug; "
        "documented defaults for the other categories"
    ) in proc.stdout
