"""Game days without a lab: the default suite validates and covers the catalogue, a suite with one
bad file starts nothing, the verdict rules, the scorecard files, and the "nothing was lost" checks
on a real DCP checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from stormwatch.chaos.gameday.scorecard import (
    Scorecard,
    ScorecardRow,
    latest_scorecard,
    load_scorecard,
    write_scorecard,
)
from stormwatch.chaos.gameday.suite import SuiteEntry, load_suite, score
from stormwatch.chaos.reports.evidence import AlertEvidence
from stormwatch.chaos.reports.verify import Check, Verification, check_checkpoint, check_loss
from stormwatch.contracts.journal import JobRef, Journal, SteadyState
from stormwatch.errors import ConfigError
from stormwatch.postmortem import ExperimentPostMortem, LossCheck, LossMismatch
from stormwatch.telemetry.events import RankEvent, StepEvent
from stormwatch.telemetry.ranklogs import RankLog
from stormwatch.trainer.checkpoint.store import (
    CompletionMarker,
    file_checksum,
    step_dir_name,
    write_marker,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SUITE = ROOT / "experiments" / "suite"
STORMWATCH = Path(sys.executable).with_name("stormwatch")

#: What the default suite must cover (issue 5): fault kind, and for gpu_xid the XID.
REQUIRED = {
    "rank kill": ("kill_rank", None),
    "node-agent kill": ("kill_agent", None),
    "node loss": ("kill_node_processes", None),
    "partition": ("partition", None),
    "rendezvous-store isolation": ("isolate_store", None),
    "hung rank": ("trainer_fault", "collective_hang"),
    "slow rank": ("trainer_fault", "slow_step"),
    "bandwidth-starved link": ("bandwidth_limit", None),
    "GPU XID 79": ("gpu_xid", 79),
    "GPU XID 48": ("gpu_xid", 48),
    "NVLink down": ("nvlink_down", None),
    "checkpoint disk full": ("checkpoint_full", None),
    # issue 18: every fault class of the detection targets
    "GPU lost": ("gpu_lost", None),
    "node cut off (its agent cannot report)": ("link_flap", None),
    "CPU-throttled rank": ("cpu_throttle", None),  # issue 18
    "lossy node": ("packet_drop", None),  # issue 18
}


def test_every_experiment_of_the_default_suite_validates_and_dry_runs() -> None:
    entries = load_suite(DEFAULT_SUITE)
    assert len(entries) >= len(REQUIRED)
    out = subprocess.run(
        [str(STORMWATCH), "chaos", "suite", str(DEFAULT_SUITE), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"{len(entries)} experiments valid; nothing was run" in out.stdout
    assert "REFUSED" not in out.stdout and "cannot place" not in out.stdout


def test_the_default_suite_covers_every_required_failure() -> None:
    seen: set[tuple[str, object]] = set()
    for entry in load_suite(DEFAULT_SUITE):
        for activity in entry.experiment.method:
            fault = getattr(activity, "fault", None)
            if fault is not None:
                detail = getattr(fault, "xid", None) or getattr(fault, "point", None)
                seen.add((fault.kind, detail))
                seen.add((fault.kind, None))
    missing = [name for name, want in REQUIRED.items() if want not in seen]
    assert not missing, f"the default suite lacks: {missing}"


def test_a_suite_with_one_invalid_file_lists_it_and_starts_nothing(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "a-good.yaml").write_text((DEFAULT_SUITE / "01-rank-kill.yaml").read_text())
    (suite / "b-bad.yaml").write_text("version: 1\ntitle: x\nmethod: 3\n")
    (suite / "notes.txt").write_text("not an experiment")
    run_dir = tmp_path / "run"

    out = subprocess.run(
        [str(STORMWATCH), "chaos", "suite", str(suite), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert out.returncode == 2, out.stderr
    assert "1 of 2 experiment(s) invalid; nothing was started" in out.stderr
    assert f"{suite / 'b-bad.yaml'}:3: method:" in out.stderr
    assert "Traceback" not in out.stderr
    assert not run_dir.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"no \*\.yaml experiment files"):
        load_suite(empty)


# -- verdicts -------------------------------------------------------------------------------------


def _journal(status: str = "completed", held: bool = True) -> Journal:
    return Journal(
        experiment_id="20260101T000000-x-abcd",
        title="x",
        file=Path("x.yaml"),
        experiment={},
        started_at=0.0,
        status=status,
        job=JobRef(name="j", log_dir=Path("/nonexistent"), world_size=4, started_by_runner=True),
        steady_state_before=SteadyState(met=True),
        steady_state_after=SteadyState(met=held),
        rollbacks_ok=True,
    )


def _pm(**fields: object) -> ExperimentPostMortem:
    base: dict[str, object] = {
        "experiment_id": "x",
        "title": "x",
        "status": "completed",
        "hypothesis_held": True,
        "rollbacks_ok": True,
        "fault_kind": "kill_rank",
        "fault_rank": 1,
        "fault_at": 100.0,
        "detected": True,
        "alertname": "StormwatchRankStalled",
        "time_to_detect_seconds": 7.0,
        "recovered": True,
        "time_to_recover_seconds": 40.0,
        "steps_lost": 5,
    }
    base.update(fields)
    return ExperimentPostMortem.model_validate(base)


ALL_OK = Verification(
    loss=Check(ok=True, detail="30 steps bitwise equal"),
    checkpoint=Check(ok=True, detail="step-00000050 complete"),
    faults_cleared=Check(ok=True, detail="none left"),
)


def _entry() -> SuiteEntry:
    return next(e for e in load_suite(DEFAULT_SUITE) if e.path.name == "01-rank-kill.yaml")


def test_a_detected_recovered_lossless_run_passes(tmp_path: Path) -> None:
    row = score(_entry(), _journal(), _pm(), ALL_OK, [], tmp_path)
    assert row.verdict == "pass", row.reasons
    assert (row.detected, row.alert, row.time_to_detect_seconds) == (
        True,
        "StormwatchRankStalled",
        7.0,
    )
    assert (row.category, row.steps_lost, row.fault) == ("software_bug", 5, "kill_rank rank 1")


def test_detection_counts_only_by_an_expected_alert_fired_after_the_fault(tmp_path: Path) -> None:
    other = _pm(alertname="StormwatchLossSpike")
    row = score(_entry(), _journal(), other, ALL_OK, [], tmp_path)
    assert row.verdict == "fail" and row.detected is False
    assert any("none of StormwatchRankStalled fired" in r for r in row.reasons)
    before = AlertEvidence(alertname="StormwatchRankStalled", labels={}, firing_at=50.0)
    after = AlertEvidence(alertname="StormwatchRankStalled", labels={}, firing_at=112.5)
    row = score(_entry(), _journal(), other, ALL_OK, [before, after], tmp_path)
    assert row.verdict == "pass", row.reasons
    assert (row.alert, row.time_to_detect_seconds) == ("StormwatchRankStalled", 12.5)


def test_a_deviation_a_lost_loss_or_a_fault_left_applied_fails(tmp_path: Path) -> None:
    row = score(_entry(), _journal("deviated", held=False), _pm(), ALL_OK, [], tmp_path)
    assert row.verdict == "fail" and "experiment deviated" in row.reasons[0]
    lost = ALL_OK.model_copy(
        update={
            "loss": Check(ok=False, detail="3 of 30 steps differ"),
            "faults_cleared": Check(ok=False, detail="sw-node1: fault f1 still applied"),
        }
    )
    row = score(_entry(), _journal(), _pm(), lost, [], tmp_path)
    assert row.verdict == "fail"
    assert row.reasons == ["loss: 3 of 30 steps differ", "faults: sw-node1: fault f1 still applied"]
    assert (row.loss, row.checkpoint, row.faults_cleared) == (False, True, False)


def test_the_scorecard_is_markdown_and_json_and_the_latest_is_found(tmp_path: Path) -> None:
    rows = [
        ScorecardRow(file="a.yaml", title="a", verdict="pass", detected=True, alert="X"),
        ScorecardRow(file="b.yaml", title="b", verdict="fail", reasons=["not detected"]),
        ScorecardRow(
            file="d.yaml",
            title="d",
            verdict="pass",
            recovered=True,
            recovered_by="fault removed",
            time_to_recover_seconds=61.0,
        ),
        ScorecardRow(file="c.yaml", title="c"),
    ]
    for suite_id in ("20260101T000000-s-0001", "20260102T000000-s-0002"):
        card = Scorecard(suite_id=suite_id, suite_dir="s", run_dir=str(tmp_path), started_at=0)
        card.rows = rows
        md, js = write_scorecard(card, tmp_path / "suites" / suite_id)
    assert latest_scorecard(tmp_path) == js
    assert load_scorecard(js).rows == rows
    text = md.read_text()
    assert "**2/4 passed**" in text
    assert "| 61.0 (f) |" in text  # recovered when the fault was removed, not by a restart
    assert "| b.yaml |" in text and "**fail**" in text and "**not run**" in text
    assert "* `b.yaml` (fail): not detected" in text
    assert latest_scorecard(tmp_path / "nowhere") is None


# -- nothing was lost -----------------------------------------------------------------------------


def _checkpoint(root: Path, step: int) -> Path:
    folder = root / step_dir_name(step)
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": {"w": torch.arange(6.0)}, "step": step}, checkpoint_id=str(folder))
    files = sorted(p.name for p in folder.iterdir())
    write_marker(
        folder,
        CompletionMarker(
            step=step,
            files=files,
            world_size=1,
            dp=1,
            tp=1,
            attempt=0,
            time=time.time(),
            checksums={n: file_checksum(folder / n) for n in files},
        ),
    )
    return folder


def test_the_latest_checkpoint_must_match_its_checksums_and_load(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _checkpoint(root, 10)
    latest = _checkpoint(root, 20)
    (root / "step-00000030.tmp-a0-dead").mkdir()  # a partial save is not "latest"

    good = check_checkpoint(root)
    assert good.ok is True and "step-00000020" in good.detail and "loads" in good.detail

    shard = next(p for p in latest.iterdir() if p.suffix == ".distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    bad = check_checkpoint(root)
    assert bad.ok is False and "checksum mismatch" in bad.detail

    assert check_checkpoint(tmp_path / "none").ok is None
    empty = tmp_path / "empty-checkpoints"
    empty.mkdir()
    assert check_checkpoint(empty).ok is False, "a job that should have checkpointed did not"
    early = check_checkpoint(empty, expected_from_step=5)
    assert early.ok is None and "stopped at step 5" in early.detail


def test_a_job_saving_with_torch_save_has_its_newest_file_loaded(tmp_path: Path) -> None:
    """A Lightning-style folder (``epoch=0-step=N.ckpt`` files and a ``last.ckpt`` link):
    the newest file loads with weights_only; a damaged newest file fails; the pre-zip format
    is not loaded (it cannot be memory-mapped); a file without a tensor fails; a file that
    only unpickles with code (a class instance) is refused, not run; a folder that cannot
    be listed and a file name that is not UTF-8 are reported, not raised."""
    root = tmp_path / "checkpoints"
    root.mkdir()
    state = {"state_dict": {"w": torch.ones(3)}, "global_step": 4, "loops": {"fit": {"n": 1}}}
    torch.save({**state, "global_step": 2}, root / "epoch=0-step=2.ckpt")
    newest = root / "epoch=0-step=4.ckpt"
    torch.save(state, newest)
    os.utime(root / "epoch=0-step=2.ckpt", (1, 1))
    (root / "last.ckpt").symlink_to(newest.name)

    good = check_checkpoint(root)
    assert good.ok is True, good.detail
    assert "epoch=0-step=4.ckpt" in good.detail and "(3 entries, 1 tensors)" in good.detail
    assert check_checkpoint(root, load=False).ok is None

    newest.write_bytes(newest.read_bytes()[:100])
    bad = check_checkpoint(root)
    assert bad.ok is False and "epoch=0-step=4.ckpt does not load" in bad.detail

    # torch < 1.6's format cannot be memory-mapped: a crafted header could claim gigabytes.
    torch.save(state, newest, _use_new_zipfile_serialization=False)
    legacy = check_checkpoint(root)
    assert legacy.ok is None and "before torch 1.6" in legacy.detail, legacy.detail

    torch.save({"global_step": 4}, newest)  # loads, but no tensor: not a checkpoint
    empty = check_checkpoint(root)
    assert empty.ok is False and "holds no tensor" in empty.detail, empty.detail

    torch.save({"obj": Path("x")}, newest)
    refused = check_checkpoint(root)
    assert refused.ok is False and "does not load" in refused.detail

    odd = tmp_path / "odd"
    odd.mkdir()
    torch.save(state, os.fsdecode(os.fsencode(odd) + b"/bad\xff.ckpt"))
    undecodable = check_checkpoint(odd)
    assert undecodable.ok is None and "bad\\xff.ckpt" in undecodable.detail
    assert Verification(checkpoint=undecodable).model_dump_json()  # writable as JSON

    unlistable = check_checkpoint(newest)  # a file where the folder should be
    assert unlistable.ok is None


def _log(losses: dict[int, float]) -> RankLog:
    events: list[RankEvent] = [
        StepEvent(time=float(s), step=s, loss=v, loss_hex=float.hex(v), attempt=0)
        for s, v in losses.items()
    ]
    return RankLog(rank=0, events=events)


def test_the_loss_check_is_bitwise_by_default_and_bounded_for_elastic_resizes() -> None:
    pm = _pm()
    pm.loss = LossCheck(identical=True, compared_steps=25, from_step=21)
    assert check_loss(pm, None, _log({1: 1.0}), mode="identical", rel_tolerance=0).ok is True
    pm.loss = LossCheck(
        identical=False,
        compared_steps=25,
        mismatches=[LossMismatch(step=22, baseline_hex=(2.0).hex(), experiment_hex=(2.5).hex())],
    )
    differ = check_loss(pm, None, _log({1: 1.0}), mode="identical", rel_tolerance=0)
    assert differ.ok is False and "first at step 22" in differ.detail

    pm.loss = LossCheck(note="the workers did not restart")  # a freeze: compare every step
    same = check_loss(
        pm,
        _log({1: 4.0, 2: 3.0}),
        _log({1: 4.0, 2: 3.0, 3: 2.0}),
        mode="identical",
        rel_tolerance=0,
    )
    assert same.ok is True and "2 steps bitwise equal" in same.detail
    changed = check_loss(
        pm, _log({1: 4.0, 2: 3.1}), _log({1: 4.0, 2: 3.0}), mode="identical", rel_tolerance=0
    )
    assert changed.ok is False and "first at step 2" in changed.detail

    baseline = _log({1: 4.0, 2: 3.0, 3: 2.0})
    close = _log({1: 4.0, 2: 3.03, 3: 2.02})
    assert check_loss(pm, close, baseline, mode="bounded", rel_tolerance=0.05).ok is True
    far = _log({1: 4.0, 2: 3.5, 3: 2.0})
    result = check_loss(pm, far, baseline, mode="bounded", rel_tolerance=0.05)
    assert result.ok is False and "at step 2" in result.detail
    assert check_loss(pm, far, None, mode="bounded", rel_tolerance=0.05).ok is None
    assert check_loss(pm, far, baseline, mode="skip", rel_tolerance=0).ok is None


def test_every_default_category_is_a_fault_kind_and_a_category_of_the_planner_table() -> None:
    from typing import get_args

    from stormwatch.faults import FAULT_CATEGORIES, AnyExperimentFault
    from stormwatch.plan import load_failure_table

    union = get_args(AnyExperimentFault)[0]
    kinds = {get_args(m.model_fields["kind"].annotation)[0] for m in get_args(union)}
    assert set(FAULT_CATEGORIES) <= kinds, set(FAULT_CATEGORIES) - kinds
    assert set(FAULT_CATEGORIES.values()) <= set(load_failure_table().ids)
    for entry in load_suite(DEFAULT_SUITE):
        category = entry.experiment.expect.category
        assert category is None or category in load_failure_table().ids, entry.path
