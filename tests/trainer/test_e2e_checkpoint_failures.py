"""A full checkpoint disk costs the job its checkpoints, not its run (up to a budget).

``stormwatch train`` runs in a mount namespace of its own whose checkpoint folder
is a 64 KiB tmpfs: every save fails with ENOSPC (the game day's
``checkpoint_full`` found that the first failed save used to end the job, with
DCP's CheckpointException, a BaseException, escaping ``except Exception``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, multiprocess

from stormwatch.telemetry.events import RankEvent, read_events

pytestmark = [pytest.mark.e2e, pytest.mark.untimed, pytest.mark.root]

SMALL = ["--seq-len", "16", "--d-model", "32", "--n-heads", "2", "--n-layers", "1"]


def _train_on_a_full_disk(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    (cwd / "ck").mkdir()
    stormwatch = str(Path(sys.executable).with_name("stormwatch"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    env["OMP_NUM_THREADS"] = "1"
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    # After the run, list what is left in the full folder (gone with the namespace after).
    script = 'mount -t tmpfs -o size=64k stormwatch-test-full ck || exit 99; "$@"; rc=$?; ls -A ck > left-in-ck.txt; exit $rc'
    command = [stormwatch, "train", *SMALL, "--checkpoint-dir", "ck", "--log-dir", "logs"]
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         *command, "--metrics-dir", "metrics", "--steps", "6", "--checkpoint-every", "2", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def _events(cwd: Path) -> list[RankEvent]:
    return read_events(cwd / "logs" / "rank0.jsonl")


def test_failed_saves_are_counted_and_training_goes_on_within_the_budget(tmp_path: Path) -> None:
    done = _train_on_a_full_disk(tmp_path, "--checkpoint-failures-allowed", "3")

    assert done.returncode == 0, done.stderr[-3000:]
    failed = [e for e in _events(tmp_path) if e.event == "checkpoint_failed"]
    assert [e.step for e in failed] == [2, 4, 6]
    assert "rank 0: OSError: [Errno 28] No space left on device" in str(failed[0].error)
    assert not [e for e in _events(tmp_path) if e.event == "checkpoint"]
    assert _events(tmp_path)[-1].event == "done"
    assert "checkpoint of step 2 failed (1 in a row, 3 allowed); training goes on" in done.stderr
    assert "Traceback" not in done.stderr
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path / "metrics"))
    failures = registry.get_sample_value(
        "stormwatch_train_checkpoint_failures_total", {"training_job": "train", "rank": "0"}
    )
    assert failures == 3  # what StormwatchCheckpointFailing alerts on
    # A failed save deletes its own temporary folder: its shards must not keep the disk full.
    assert (tmp_path / "left-in-ck.txt").read_text() == ""


def test_async_saves_count_each_failure_at_its_own_step(tmp_path: Path) -> None:
    done = _train_on_a_full_disk(
        tmp_path, "--checkpoint-mode", "async", "--checkpoint-failures-allowed", "3"
    )

    assert done.returncode == 0, done.stderr[-3000:]
    failed = [e for e in _events(tmp_path) if e.event == "checkpoint_failed"]
    assert [e.step for e in failed] == [2, 4, 6]
    assert str(failed[0].error).count("rank 0:") == 1, failed[0].error
    assert (tmp_path / "left-in-ck.txt").read_text() == ""


def test_one_failed_save_more_than_allowed_stops_the_job_naming_the_flag(tmp_path: Path) -> None:
    done = _train_on_a_full_disk(tmp_path, "--checkpoint-failures-allowed", "1")

    assert done.returncode == 1, done.stderr[-3000:]
    assert (
        "error: 2 checkpoint saves in a row failed (at most 1 allowed: "
        "--checkpoint-failures-allowed); last: saving step 4 into ck/step-00000004"
    ) in done.stderr
    assert "No space left on device" in done.stderr.splitlines()[-1]
    assert [e.step for e in _events(tmp_path) if e.event == "checkpoint_failed"] == [2, 4]
    assert "done" not in [e.event for e in _events(tmp_path)]
