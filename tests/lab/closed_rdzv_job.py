"""Stand-in worker for the FC-09 relaunch test: under the job's first rendezvous id it prints
what torchrun prints when its rendezvous was closed and fails; under a relaunch id
(``<job>-r<N>``, lab/jobs/launch.py ``relaunch_closed``) it succeeds."""

from __future__ import annotations

import os
import re
import sys

if not re.search(r"-r\d+$", os.environ.get("TORCHELASTIC_RUN_ID", "")):
    print("torch.distributed.elastic.rendezvous.api.RendezvousClosedError", flush=True)
    sys.exit(1)
print(f"relaunched as {os.environ['TORCHELASTIC_RUN_ID']}", flush=True)
