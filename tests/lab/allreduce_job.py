"""A trivial distributed job for lab tests: one gloo all-reduce across every rank.

Run by torchrun (``--no-python``: ``python allreduce_job.py OUT_DIR [SLEEP_S]``).
Each rank writes ``OUT_DIR/rank<R>.json`` with what it saw, so a test can check
that every rank of every namespace joined one process group.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> int:
    out_dir = Path(sys.argv[1])
    sleep_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    time.sleep(sleep_s)
    dist.barrier()
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "world_size": world,
        "sum": value.item(),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "job": os.environ.get("STORMWATCH_JOB"),
        "metrics_dir": os.environ.get("STORMWATCH_METRICS_DIR"),
        "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
