"""`stormwatch train` as a user runs it: progress on stderr, warnings, and one message per mistake."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]

SMALL = ["--seq-len", "16", "--d-model", "32", "--n-heads", "2", "--n-layers", "1"]


def _stormwatch() -> str:
    path = Path(sys.executable).with_name("stormwatch")
    return str(path) if path.exists() else shutil.which("stormwatch") or "stormwatch"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["OMP_NUM_THREADS"] = "1"
    return env


def _train(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_stormwatch(), "train", *SMALL, "--checkpoint-dir", "ck", "--log-dir", "logs", *args],
        env=_env(), cwd=cwd, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def test_standalone_run_prints_progress_and_rerun_past_steps_warns(tmp_path):
    done = _train(tmp_path, "--steps", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("train: ")]
    assert len(lines) == 3, done.stderr
    assert "world size 1, mesh dp_shard=1 x tp=1, fresh start (ready " in lines[0]
    assert "s after start), training to step 3" in lines[0]
    assert "checkpoints: ck" in lines[0]
    assert lines[1].startswith("train: step 3/3  loss ")
    assert "tokens/s" in lines[1]
    assert "done, 3 steps (1..3)" in lines[2]
    assert "checkpoints: ck; logs: logs" in lines[2]

    again = _train(tmp_path, "--steps", "2", "--quiet")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "at step 3, past --steps 2: nothing was trained" in again.stderr
    assert "train: step" not in again.stderr


def test_option_mistake_under_torchrun_is_printed_once_before_torchruns_summary(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--no-python", _stormwatch(), "train", "--dp", "3", "--tp", "1"],
        env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    message = "dp_shard=3 x tp=1 = 3 ranks, but the world size is 2"
    assert done.stdout.count(message) == 1, done.stdout
    assert "Traceback" not in done.stdout.split(message)[0]  # ours comes first, without one
    if "ChildFailedError" in done.stdout:  # torchrun's own summary, after ours
        assert done.stdout.index(message) < done.stdout.index("ChildFailedError")
