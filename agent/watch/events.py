"""The agent's rank event log: ``<state-dir>/events.jsonl`` and ``GET /v1/events``.

One JSON object per line, appended as events happen::

    {"time": UNIX_SECONDS, "node": str, "kind": str, "job": str, "rank": int, ...details}

Kinds: ``rank_exit`` (``pid``, ``clean``, ``replaced``, ``exit_code``: as in
``subprocess``, the exit code or minus the killing signal's number, from the
Linux proc connector (:mod:`stormwatch.agent.watch.proc_exits`; ranks are torchrun's
children, not the agent's) or from a zombie's ``/proc/<pid>/stat``, ``null`` when
unknown; ``exit_signal``: ``"SIGKILL"``... or ``null``; ``reason``: ``finished``,
``exit_code``, ``signal`` or ``unknown``, the label of
``stormwatch_rank_exits_total``), ``rank_hang`` / ``rank_hang_cleared``
and ``rank_straggler`` / ``rank_straggler_cleared`` (details from
:mod:`stormwatch.agent.watch.detectors`). The newest :data:`KEEP` events (including
those already in the file at start) are also kept in memory for the API.
Writing never raises: a failed append is logged and the event stays in memory.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Events kept in memory for ``GET /v1/events``.
KEEP = 1000


class EventLog:
    """Append-only JSON-lines event log with an in-memory tail.

    Args:
        path: the ``events.jsonl`` file (its folder is created when missing).
        node: written into every event.
        clock: Unix time of each event.
    """

    def __init__(self, path: Path, node: str, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._node = node
        self._clock = clock
        self._lock = threading.Lock()
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP)
        self._load()

    def _load(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()[-KEEP:]
        except OSError:
            return
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                self._events.append(event)

    def record(self, kind: str, job: str, rank: int, **details: Any) -> dict[str, Any]:
        """Append one event (timestamped now) and return it."""
        event = {
            "time": self._clock(),
            "node": self._node,
            "kind": kind,
            "job": job,
            "rank": rank,
            **details,
        }
        line = json.dumps(event, default=str)
        with self._lock:
            self._events.append(event)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(line + "\n")
            except OSError as exc:
                log.warning("cannot append to %s: %s", self.path, exc)
        log.info("event %s job=%s rank=%d %s", kind, job, rank, details)
        return event

    def events(
        self, *, since: float | None = None, kind: str | None = None, job: str | None = None
    ) -> list[dict[str, Any]]:
        """Events in time order, optionally after ``since`` (Unix s) / of one kind / job."""
        with self._lock:
            return [
                e
                for e in self._events
                if (since is None or e.get("time", 0) > since)
                and (kind is None or e.get("kind") == kind)
                and (job is None or e.get("job") == job)
            ]


__all__ = ["KEEP", "EventLog"]
