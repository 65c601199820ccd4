"""A stand-in training rank for fast chaos tests (run as a script, not imported by pytest).

    STORMWATCH_JOB=job RANK=0 python workload.py LOG_DIR [STEP_SECONDS]

Appends the trainer's rank-log events (docs/ARCHITECTURE.md) to
``LOG_DIR/rank<RANK>.jsonl``: one ``start``, then a ``step`` every STEP_SECONDS
(default 0.05) with a deterministic loss, until killed. A SIGSTOP'ed workload
stops stepping; SIGCONT resumes it. It is the real process a ``freeze_rank``
fault signals; the trainer itself is exercised by the e2e tier.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    log_dir = Path(sys.argv[1])
    step_seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"rank{rank}.jsonl", "a", buffering=1) as fh:
        fh.write(
            json.dumps(
                {
                    "event": "start",
                    "time": time.time(),
                    "rank": rank,
                    "attempt": attempt,
                    "resumed_from_step": 0,
                }
            )
            + "\n"
        )
        step = 0
        while True:
            time.sleep(step_seconds)
            step += 1
            loss = 1.0 / step
            fh.write(
                json.dumps(
                    {
                        "event": "step",
                        "time": time.time(),
                        "step": step,
                        "loss": loss,
                        "loss_hex": loss.hex(),
                        "attempt": attempt,
                        "step_seconds": step_seconds,
                    }
                )
                + "\n"
            )


if __name__ == "__main__":
    main()
