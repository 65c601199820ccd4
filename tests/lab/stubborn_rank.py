"""A rank that does not stop on SIGTERM, for the stop tests (issue 17, item 3).

Run by torchrun (``--no-python``: ``python stubborn_rank.py``) as a job's ``command``.
Each rank ignores SIGTERM (what a rank blocked inside a collective amounts to: its handler
never runs) and appends ``{"pid", "rank", "restart", "time"}`` to
``$STORMWATCH_LOG_DIR/stubborn.jsonl``; rank 0 also starts a helper that daemonises (double
fork, its own session) and so is re-parented away from the Slurm step: Slurm's
``proctrack/linuxproc`` no longer finds it under the job, though it still carries the job's
``SLURM_JOB_ID``. Its record has ``"helper": <pid>``. No torch: it starts in milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


def _helper() -> int:
    """Daemonise a sleeper that ignores SIGTERM; its pid."""
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            while True:
                time.sleep(1)
        os._exit(0)
    os.close(write_end)
    pid = int(os.read(read_end, 32))
    os.close(read_end)
    os.wait()
    return pid


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = int(os.environ["RANK"])
    record = {
        "pid": os.getpid(),
        "rank": rank,
        "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
        "time": time.time(),
    }
    if rank == 0:
        record["helper"] = _helper()
    with open(Path(os.environ["STORMWATCH_LOG_DIR"]) / "stubborn.jsonl", "a") as out:
        out.write(json.dumps(record) + "\n")
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
