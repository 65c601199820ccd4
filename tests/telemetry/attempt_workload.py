"""A torchrun worker for the job-attempt test: agrees the job attempt, then fails as told.

Each rank starts its telemetry (log folder from ``STORMWATCH_LOG_DIR``), joins the gloo
process group, agrees the job's attempt (:meth:`stormwatch.telemetry.Session.agree_attempt`)
and writes ``<out>/a<job attempt>-<node>.json`` with what it agreed. Then, per job attempt
(``FAIL_PLAN``: ``"0:nodeA,1:nodeB"``), the rank on the named node exits 1 while the
other node's rank waits outside any collective (torchrun stops it because its peer
failed: its node does not count that restart); without a failure for this attempt both
finish cleanly.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

import stormwatch.telemetry as swt


def main() -> int:
    out = Path(os.environ["ATTEMPT_OUT"])
    node = os.environ["STORMWATCH_NODE"]
    plan = dict(item.split(":") for item in os.environ["FAIL_PLAN"].split(","))
    session = swt.init(collectives=False, handle_signals=False)
    dist.init_process_group("gloo")
    agreed = session.agree_attempt()
    assert agreed is not None
    (out / f"a{agreed.attempt}-{node}.json").write_text(
        json.dumps(
            {
                "attempt": agreed.attempt,
                "node_restarts": agreed.node_restarts,
                "failed_nodes": list(agreed.failed_nodes),
                "rank": dist.get_rank(),
            }
        )
    )
    session.start()
    failing = plan.get(str(agreed.attempt))
    if failing == node:
        time.sleep(1.0)  # the peer is past the agreement too, waiting outside collectives
        os._exit(1)
    if failing is not None:
        time.sleep(120)  # until torchrun stops this worker for the next round
        return 3
    dist.barrier()
    session.shutdown()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
