"""FC-10 on CPU: a rank that never joins a collective ends the job within a bound, with dumps.

2 gloo ranks (dp=2). Rank 1's control file arms ``collective_hang`` on the dp_shard
all-reduce (no expiry): for rank 0 its peer skipped the collective. With
``--collective-timeout 3`` rank 0's all-reduce times out, it writes its dump
and exits; torchrun then stops rank 1 with SIGTERM, which writes its own.
The dumps are PyTorch's flight recorder (it covers gloo in torch 2.13) plus
our dispatch-mode record of the last collectives.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stormwatch.telemetry.dump import rank_dump_paths

pytestmark = pytest.mark.e2e

TIMEOUT_SECONDS = 3
#: torchrun start-up + one step + the collective timeout + teardown, with room for a busy CI box.
BOUND_SECONDS = 60


def _stormwatch() -> str:
    path = Path(sys.executable).with_name("stormwatch")
    return str(path) if path.exists() else shutil.which("stormwatch") or "stormwatch"


def test_fc10_skipped_collective_ends_every_rank_in_bounded_time_with_dumps(
    tmp_path, arm_control_file
):
    hang = {"point": "collective_hang", "op": "all_reduce", "mesh_dim": "dp_shard"}
    arm_control_file(tmp_path / "metrics" / "control", 1, hang)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    env["OMP_NUM_THREADS"] = "1"
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"):
        env.pop(name, None)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--no-python", _stormwatch(), "train", "--dp", "2", "--tp", "1", "--steps", "3",
        "--n-layers", "1", "--log-dir", str(tmp_path / "logs"),
        "--metrics-dir", str(tmp_path / "metrics"),
        "--collective-timeout", str(TIMEOUT_SECONDS),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=BOUND_SECONDS * 2,
        check=False, cwd=tmp_path,
    )  # fmt: skip
    seconds = time.monotonic() - started
    print(f"\nFC-10 hang run: {seconds:.1f}s")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert seconds < BOUND_SECONDS, output[-3000:]
    assert "Timed out waiting" in output  # rank 0: the collective timeout fired

    # one incarnation each: one dump file each (rank<R>.attempt<A>.pid<P>.json)
    dumps = {rank: json.loads(_only(rank_dump_paths(tmp_path / "logs" / "dumps", rank)).read_text()) for rank in (0, 1)}  # fmt: skip
    assert "Timed out" in dumps[0]["reason"]
    assert dumps[1]["reason"].startswith("Terminated")  # stopped by torchrun
    last = {}
    for rank, dump in dumps.items():
        assert dump["rank"] == rank and dump["step"] == 1
        recorder = dump["flight_recorder"]
        assert recorder is not None, dump["flight_recorder_error"]
        assert any(e["profiling_name"].startswith("gloo:") for e in recorder["entries"])
        last[rank] = max(int(s["last_enqueued_collective"]) for s in recorder["pg_status"].values())
        assert dump["collectives"], "our own record of the last collectives"
    # The post-mortem's clue: rank 0 enqueued one collective more than rank 1 ever did.
    assert last[0] == last[1] + 1
    pending = [c for c in dumps[0]["collectives"] if c["seconds"] is None]
    assert [(c["op"], c["mesh_dim"]) for c in pending] == [("all_reduce", "dp_shard")]


def _only(paths: list[Path]) -> Path:
    assert len(paths) == 1, paths
    return paths[0]
