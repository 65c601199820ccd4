"""TTL reaper for controller-side faults: ``python -m stormwatch.chaos.ledger.reaper LEDGER FAULT_ID``.

Started detached (own session) when a fault that nothing else reverts is injected
(a kind whose :attr:`~stormwatch.faults.Traits.reverts_itself` is false: ``freeze_rank``,
controller-side; ``kill_agent``, whose dead agent reverts nothing). It polls the ledger and exits as soon as the
fault is reverted; at ``expires_at`` it reverts the fault itself (reason
``ttl``). So the fault ends at its TTL even if the controller was SIGKILLed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.ledger.ledger import Ledger
from stormwatch.chaos.ledger.revert import revert_entries

#: How often the reaper looks at the ledger (s): bounds how long it outlives a revert.
POLL_SECONDS = 0.5


def spawn_reaper(ledger_path: Path, fault_id: str) -> None:
    """Start a reaper for ``fault_id``, detached: in its own session and not our child
    (``sh`` backgrounds it and exits), so killing the controller does not kill it.

    Raises:
        subprocess.CalledProcessError: ``sh`` could not start it.
    """
    subprocess.run(
        [
            "/bin/sh",
            "-c",
            'exec "$@" </dev/null >/dev/null 2>&1 &',
            "sh",
            sys.executable,
            "-m",
            "stormwatch.chaos.ledger.reaper",
            str(ledger_path),
            fault_id,
        ],
        start_new_session=True,
        check=True,
        timeout=30,
    )


async def reap(ledger_path: Path, fault_id: str) -> str:
    """Wait for the fault to be reverted or to expire (then revert it); returns what happened."""
    while True:
        if not ledger_path.exists():
            return "ledger removed"
        try:
            entry = Ledger(ledger_path, create=False).get(fault_id)
        except ChaosError as exc:
            return f"cannot read the ledger: {exc}"
        if not entry.open:
            return "reverted by someone else"
        if time.time() >= entry.expires_at:
            ledger = Ledger(ledger_path, create=False)
            async with aiohttp.ClientSession() as session:
                outcomes = await revert_entries(ledger, [entry], reason="ttl", session=session)
            return outcomes[0].detail
        await asyncio.sleep(min(POLL_SECONDS, max(0.0, entry.expires_at - time.time())))


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m stormwatch.chaos.ledger.reaper LEDGER FAULT_ID``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m stormwatch.chaos.ledger.reaper LEDGER FAULT_ID", file=sys.stderr)
        return 2
    asyncio.run(reap(Path(args[0]), args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["reap", "spawn_reaper"]
