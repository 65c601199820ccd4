"""Every process group the trainer makes has its collective timeout, in every layout.

torch gives ``init_process_group``'s timeout to the default group only: a DeviceMesh's
sub-groups and the async checkpoint's own group got torch's 30 minutes, so a collective
on ``dp_shard`` with a frozen peer was still blocked after 45 s of a 5 s timeout.

Four real gloo ranks (processes forked from one that imported torch once) run the real
trainer (:func:`stormwatch.trainer.loop.train`, one step, async checkpoints) in each
layout the trainer offers; when the trainer has made its last group (where it checks
them itself), the test reads every group's timeout from torch's own registry.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

TIMEOUT = timedelta(seconds=7)
#: name -> the trainer's degrees; every sub-group of each has a real peer (4 ranks).
LAYOUTS = {
    "dp x tp": {"dp": 2, "tp": 2},
    "pp x dp": {"pp": 2, "dp": 2},
    "hsdp": {"dp_replicate": 2, "dp": 2},
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank(rank: int, port: int, degrees: dict[str, int], root: str, out: Any) -> None:
    """One rank: train one step, recording every group's timeout when the trainer checks."""
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        os.environ.update(RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank))
        from stormwatch.trainer import loop, runtime
        from stormwatch.trainer.config import (
            CheckpointConfig,
            DataConfig,
            DebugConfig,
            ModelConfig,
            TelemetryConfig,
            TrainConfig,
        )

        seen: dict[str, float] = {}

        def check(expected: timedelta) -> dict[str, timedelta]:
            seen.update({k: v.total_seconds() for k, v in runtime.group_timeouts().items()})
            return runtime.check_group_timeouts(expected)

        loop.check_group_timeouts = check  # the trainer's own check, observed
        config = TrainConfig(
            steps=1,
            **degrees,
            model=ModelConfig(d_model=16, n_heads=2, n_layers=2, max_seq_len=8, dropout=0.0),
            data=DataConfig(seq_len=8, micro_batch=2, corpus_max_bytes=1 << 13),
            checkpoint=CheckpointConfig(directory=Path(root) / "ckpt", every=1, mode="async"),
            telemetry=TelemetryConfig(metrics_dir=None, log_dir=None),
            debug=DebugConfig(dump_dir=None, collective_timeout=TIMEOUT.total_seconds()),
        )
        env = runtime.RankEnv(rank=rank, local_rank=rank, world_size=4, under_torchrun=True)
        loop.train(config, env)
        out.put((rank, seen))
    except BaseException:
        out.put((rank, traceback.format_exc()))


def _run_layout(degrees: dict[str, int], root: Path) -> dict[int, Any]:
    # the ranks unpickle _rank by this module's name (tests.trainer...): the forkserver,
    # which takes this process's sys.path when the first start() below starts it, must
    # find the repository's root there (pytest's importlib mode does not put it)
    repo = str(Path(__file__).resolve().parents[2])
    if repo not in sys.path:
        sys.path.append(repo)
    context = multiprocessing.get_context("forkserver")
    # torch._dynamo: what FSDP2 imports at its first DTensor (1 s+ of CPU a rank otherwise)
    context.set_forkserver_preload(["stormwatch.trainer.loop", "torch._dynamo"])
    out = context.Queue()
    port = _free_port()
    procs = [
        context.Process(target=_rank, args=(r, port, degrees, str(root), out)) for r in range(4)
    ]
    for proc in procs:
        proc.start()
    try:
        results = dict(out.get(timeout=120) for _ in procs)
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    return results


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_process_group_of_the_trainer_has_the_collective_timeout(
    layout: str, tmp_path: Path
) -> None:
    results = _run_layout(LAYOUTS[layout], tmp_path)
    for rank, seen in sorted(results.items()):
        assert isinstance(seen, dict), f"rank {rank} failed:\n{seen}"
        descriptions = {name.split(" ")[0] for name in seen}
        # the default group, the mesh's sub-groups and the async checkpoint's group
        assert {"default_pg", "mesh_dp_shard", "checkpoint_async"} <= descriptions, seen
        assert seen and set(seen.values()) == {TIMEOUT.total_seconds()}, (rank, seen)
    sub_groups = {name.split(" ")[0] for name in results[0]} - {"default_pg"}
    expected = {f"mesh_{d}" for d in ("dp_shard", "tp", "pp", "dp_replicate")} & {
        f"mesh_{'dp_shard' if k == 'dp' else k}" for k in LAYOUTS[layout]
    }
    assert expected <= sub_groups, sub_groups
