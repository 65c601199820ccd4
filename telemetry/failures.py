"""What an exception from a collective or a checkpoint save says about its cause.

:func:`lost_peer` tells a collective that failed because a rank at the other end is gone
(it died, or left in an elastic resize) from any other failure. The job cannot go on past
one: its process group is broken, and it fails at its next collective. So a save cut short
by one is not a failed save (:meth:`stormwatch.telemetry.Session.checkpoint`; the reference
trainer's checkpointer re-raises it): counting it fired StormwatchCheckpointFailing on a
fault-free elastic job (the soak's end-to-end test, 2026-12-06).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

from stormwatch.errors import cause_chain

#: What gloo's TCP transport says when the rank at the other end of a connection is gone:
#: torch raises it as a plain ``RuntimeError``, with no type or errno to tell it by
#: (gloo/transport/tcp/pair.cc: "Connection closed by peer", or a read error naming
#: ``ECONNRESET``), so the message is all there is. gloo prefixes it with its source file
#: (``[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:17334``):
#: the same words from another library (a storage client's reset upload) are not a peer.
GLOO_PEER_GONE = re.compile(
    r"pair\.cc:\d+\].*(Connection closed by peer|Connection reset by peer|Socket closed)"
)


def says_peer_gone(text: str) -> bool:
    """Whether ``text`` (a gloo error's message) says the rank at the other end is gone."""
    return bool(GLOO_PEER_GONE.search(text))


def rank_failures(exc: BaseException) -> Iterator[tuple[int | None, BaseException]]:
    """``(rank, exception)`` for each rank's failure that a DCP ``CheckpointException``
    wraps (DCP gathers every rank's; its ``failures`` maps rank to ``(exception,
    traceback)``), by rank; ``(None, exc)`` for any other exception."""
    failures = getattr(exc, "failures", None)
    if not (isinstance(failures, dict) and failures):
        yield None, exc
        return
    for rank, wrapped in sorted(failures.items()):
        yield rank, wrapped[0] if isinstance(wrapped, tuple) else wrapped


def lost_peer(exc: BaseException) -> BaseException | None:
    """The failure in ``exc`` that says the job's process group broke (a collective lost
    its peer), or None. Looked for in ``exc``, among the ranks' failures DCP wrapped in it,
    and in what each was raised from (``raise ... from``, the context).

    NCCL raises ``torch.distributed.DistBackendError`` once its communicator is aborted,
    whatever aborted it (a dead peer, or its watchdog's timeout: the communicator cannot be
    used again either way); a broken TCP connection raises ``DistNetworkError``; gloo a
    ``RuntimeError`` naming the closed or reset connection (:data:`GLOO_PEER_GONE`). gloo's
    timed-out collective is not one: a peer slow to write (slow storage) times its peers
    out, and gloo's group stays usable.
    """
    # Importing this package does not import torch: without it loaded, no torch error exists.
    dist = sys.modules.get("torch.distributed")
    dist_errors = () if dist is None else (dist.DistBackendError, dist.DistNetworkError)
    for _rank, failure in rank_failures(exc):
        for inner in cause_chain(failure):
            if isinstance(inner, dist_errors):
                return inner
            if isinstance(inner, RuntimeError) and says_peer_gone(str(inner)):
                return inner
    return None


__all__ = ["GLOO_PEER_GONE", "lost_peer", "rank_failures", "says_peer_gone"]
