"""End to end: chaos fault points armed through the control channel on 2 gloo ranks (dp=2).

One run; rank 1's control file arms every point before the start: extra
compute per step, a delay in the dp all-reduce, a checkpoint request, an
error at the last step, and a hang that has already expired (must not fire).
Rank 0 has no file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from stormwatch.telemetry.events import read_events
from stormwatch.trainer.checkpoint import store

pytestmark = pytest.mark.e2e

STEPS = 4
ERROR_STEP = 4
SLOW_SECONDS = 0.3


def _stormwatch() -> str:
    path = Path(sys.executable).with_name("stormwatch")
    return str(path) if path.exists() else shutil.which("stormwatch") or "stormwatch"


@pytest.fixture(scope="module")
def armed_run(tmp_path_factory, arm_control_file):
    root = tmp_path_factory.mktemp("control")
    now = time.time()
    arm_control_file(
        root / "metrics" / "control",  # the default: <metrics-dir>/control
        1,
        {"point": "slow_step", "seconds": SLOW_SECONDS, "expires_at": now + 3600},
        {"point": "collective_delay", "seconds": 0.05, "op": "all_reduce", "mesh_dim": "dp_shard"},
        {"point": "checkpoint_now", "requested_at": now},
        {"point": "error_at_step", "step": ERROR_STEP},
        {"point": "collective_hang", "expires_at": now - 1},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--no-python", _stormwatch(), "train", "--dp", "2", "--tp", "1", "--steps", str(STEPS),
        "--n-layers", "1", "--checkpoint-every", "100", "--job", "ctl",
        "--checkpoint-dir", str(root / "ckpt"), "--log-dir", str(root / "logs"),
        "--metrics-dir", str(root / "metrics"),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=180, check=False, cwd=root
    )
    print(f"\narmed control run: {time.monotonic() - started:.1f}s")
    return root, done


def _faults(root: Path, rank: int) -> list[tuple[str, int]]:
    events = read_events(root / "logs" / f"rank{rank}.jsonl")
    return [(e.point, e.step) for e in events if e.event == "fault"]


def test_fault_points_fire_on_the_armed_rank_only(armed_run):
    root, done = armed_run
    assert done.returncode != 0  # error_at_step ended the run
    assert "fault point error_at_step fired at step 4" in done.stdout + done.stderr
    assert _faults(root, 0) == []
    fired = _faults(root, 1)
    for step in range(1, ERROR_STEP):
        assert ("slow_step", step) in fired
        assert ("collective_delay", step) in fired
    assert ("error_at_step", ERROR_STEP) in fired
    assert not any(point == "collective_hang" for point, _ in fired)  # expired before the start
    steps = [e.step for e in read_events(root / "logs" / "rank0.jsonl") if e.event == "step"]
    assert steps == [1, 2, 3]


def test_checkpoint_request_on_one_rank_saves_on_every_rank(armed_run):
    root, _ = armed_run
    for rank in (0, 1):
        events = read_events(root / "logs" / f"rank{rank}.jsonl")
        assert [e.step for e in events if e.event == "checkpoint"] == [1]  # once, agreed
    assert [c.step for c in store.scan(root / "ckpt").complete] == [1]
    assert ("checkpoint_now", 1) in _faults(root, 1)


def test_fault_injections_are_counted_by_point(armed_run):
    root, _ = armed_run
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(root / "metrics"))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }

    def injected(rank: int, point: str) -> float | None:
        labels = (("point", point), ("rank", str(rank)), ("training_job", "ctl"))  # sorted
        return samples.get(("stormwatch_train_fault_injections_total", labels))

    assert injected(1, "slow_step") == ERROR_STEP - 1
    assert injected(1, "error_at_step") == 1
    assert injected(0, "slow_step") is None
    compute = {
        r: samples[
            ("stormwatch_train_compute_seconds_total", (("rank", str(r)), ("training_job", "ctl")))
        ]
        for r in (0, 1)
    }
    assert compute[1] > compute[0] + SLOW_SECONDS  # the straggler is visible
