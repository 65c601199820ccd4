"""The culprit of a hang, named while it lasts from its ranks' flight recorders (FC-10).

When a job's rank hangs, the agent asks each of the job's running ranks on this node for
its post-mortem dump: it writes ``<dump-dir>/rank<R>.request``, which a thread of the
rank answers by writing its dump (``<dump-dir>/rank<R>.attempt<A>.pid<P>.json``, older
writers ``rank<R>.json``: the newest of either is read) with PyTorch's flight recorder
(:mod:`stormwatch.telemetry.dump_requests`: every telemetry session answers; a thread
can, while the rank's main thread waits inside a collective, where no signal handler
runs). It waits up to :data:`DUMP_WAIT_SECONDS` for the answers, then names the culprit
with :func:`stormwatch.postmortem.culprit_from_dumps`: the rank behind its peers and
inside no collective, or, when every rank that answered waits inside one, the rank that
could not answer (stopped, or hung where no thread of it runs).

Only this node's ranks are asked: a culprit on another node leaves this node's ranks all
waiting and answering, and no rank is named here (the incident post-mortem compares
every node's dumps). Ranks that name no dump folder are not asked. Nothing here raises.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stormwatch.agent.watch.diagnostics import RankTarget, load_dump_modules

# The trainer's dump files and the post-mortem's culprit rules are imported when a hang
# is diagnosed, not at start-up: the agent's steady state never needs them (with their
# packages, ~5 MiB of its memory).
if TYPE_CHECKING:
    from stormwatch.postmortem import Culprit
    from stormwatch.telemetry.dump import DumpRecord

log = logging.getLogger(__name__)

#: Seconds the agent waits for the ranks' dumps: ranks look for a request every
#: :data:`~stormwatch.telemetry.dump_requests.POLL_SECONDS` (0.5 s) and a dump of a
#: 2,000-entry flight recorder takes tens of milliseconds; 5 s covers a loaded node.
DUMP_WAIT_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class HangCulprit:
    """What the dumps of a hung job's ranks say (the ``rank_hang_culprit`` event's details).

    Attributes:
        culprit: the culprit, None when the dumps name none.
        asked: ranks asked for a dump (those with a dump folder).
        answered: ranks whose dump arrived in time.
    """

    culprit: Culprit | None
    asked: tuple[int, ...]
    answered: tuple[int, ...]


def ask(targets: Sequence[RankTarget], *, reason: str, now: float) -> dict[int, Path]:
    """Write a dump request for every target that has a dump folder; rank -> its folder
    (requests that cannot be written are logged and left out)."""
    load_dump_modules()
    from stormwatch.telemetry.dump_requests import write_request

    asked: dict[int, Path] = {}
    for target in targets:
        folder = target.dump_dir
        if folder is None:
            continue
        try:
            write_request(folder, target.key[1], reason, now)
        except OSError as exc:
            log.warning("cannot ask rank %d for a dump in %s: %s", target.key[1], folder, exc)
            continue
        asked[target.key[1]] = folder
    return asked


def answers(
    asked: Mapping[int, Path],
    *,
    since: float,
    wait: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, DumpRecord]:
    """rank -> its dump written at or after ``since``, waiting up to ``wait`` seconds for
    every rank in ``asked`` (returns early once all have answered)."""
    load_dump_modules()
    from stormwatch.telemetry.dump import latest_dump
    from stormwatch.telemetry.dump_requests import POLL_SECONDS

    found: dict[int, DumpRecord] = {}
    deadline = clock() + wait
    while True:
        for rank, folder in asked.items():
            if rank in found:
                continue
            record = latest_dump(folder, rank, since)  # None: not written yet
            if record is not None:
                found[rank] = record
        if len(found) == len(asked) or clock() >= deadline:
            return found
        sleep(min(POLL_SECONDS / 5, max(deadline - clock(), 0.0)))


def diagnose(
    targets: Sequence[RankTarget], *, reason: str, now: float, wait: float = DUMP_WAIT_SECONDS
) -> HangCulprit:
    """Ask ``targets`` (one job's running ranks on this node) for their dumps and name the
    culprit (see the module docstring)."""
    load_dump_modules()
    from stormwatch.postmortem import culprit_from_dumps
    from stormwatch.telemetry.culprit import reduce_dump

    asked = ask(targets, reason=reason, now=now)
    got = answers(asked, since=now, wait=wait) if asked else {}
    culprit = culprit_from_dumps((reduce_dump(d) for d in got.values()), asked) if got else None
    return HangCulprit(culprit=culprit, asked=tuple(sorted(asked)), answered=tuple(sorted(got)))


__all__ = ["DUMP_WAIT_SECONDS", "HangCulprit", "answers", "ask", "diagnose"]
