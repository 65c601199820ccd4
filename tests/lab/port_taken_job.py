"""Stand-in worker for the lab's relaunch after a port conflict (issue 17, item 6).

``python port_taken_job.py OUT``. Under the job's first rendezvous id, rank 0 binds a port
another socket holds and fails with the kernel's own ``OSError: [Errno 98] Address already
in use`` (what a restarted rank's store gets while a process of the previous attempt still
listens on its port); the other ranks record ``{"pid", "create_time"}`` in
``OUT/old-<rank>.json`` and stay, those of the second node ignoring SIGTERM (a rank blocked
in a collective), so the lab's stop must escalate to SIGKILL. Under a relaunch id
(``<job>-r<N>``) each rank writes ``OUT/new-<rank>.json`` with the old ranks still alive
when it started (none, if the lab waited for them to be gone) and exits 0. No torch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import psutil

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rank = int(os.environ["RANK"])
if re.search(r"-r\d+$", os.environ.get("TORCHELASTIC_RUN_ID", "")):
    alive = []
    for record in out.glob("old-*.json"):
        old = json.loads(record.read_text())
        try:
            proc = psutil.Process(old["pid"])
            if proc.create_time() == old["create_time"] and proc.status() != "zombie":
                alive.append(old["pid"])
        except psutil.NoSuchProcess:
            continue
    (out / f"new-{rank}.json").write_text(json.dumps({"old_alive": alive}))
    sys.exit(0)
if rank == 0:
    with socket.socket() as holder, socket.socket() as second:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        second.bind(holder.getsockname())  # raises OSError EADDRINUSE: the traceback is logged
me = psutil.Process()
(out / f"old-{rank}.json").write_text(json.dumps({"pid": me.pid, "create_time": me.create_time()}))
if rank >= int(os.environ["LOCAL_WORLD_SIZE"]):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(300)
