"""The agent's rank event log: ``<state-dir>/events.jsonl`` and ``GET /v1/events``.

One JSON object per line, appended as events happen::

    {"time": UNIX_SECONDS, "node": str, "kind": str, "job": str, "rank": int, ...details}

The one declaration of its records is :data:`AgentEvent` (a union discriminated
by ``kind``), used by the writer (:class:`EventLog`), the API and every reader
outside the agent (incident post-mortems, tests: :func:`read_agent_events`).
Kinds: ``rank_orphaned`` (:class:`RankOrphanedEvent`: a rank's process outlived its launcher),
``rank_exit`` (:class:`RankExitEvent`: ``pid``, ``clean``, ``replaced``,
``exit_code``: as in ``subprocess``, the exit code or minus the killing signal's
number, from the Linux proc connector (:mod:`stormwatch.agent.watch.proc_exits`;
ranks are torchrun's children, not the agent's) or from a zombie's
``/proc/<pid>/stat``, ``null`` when unknown; ``exit_signal``: ``"SIGKILL"``... or
``null``; ``reason``: ``finished``, ``stopped``, ``exit_code``, ``signal`` or ``unknown``, the
label of ``stormwatch_rank_exits_total``), ``rank_hang`` / ``rank_hang_cleared``
and ``rank_straggler`` / ``rank_straggler_cleared`` (details from
:mod:`stormwatch.agent.watch.detectors`), ``rank_hang_culprit`` (:class:`RankHangCulpritEvent`:
the rank a hung job's flight recorders name, :mod:`stormwatch.agent.watch.hangdumps`). A line holds the keys its writer gave,
in the order the model declares them; details not given are left out (they are
not written as ``null``).

Reading is tolerant: keys a later agent may add are kept (and served) but not
typed, and a line that is not an event (a torn last line, another kind) is
skipped. The newest :data:`KEEP` events (including those already in the file at
start) are also kept in memory for the API. Writing never raises for I/O: a
failed append is logged and the event stays in memory.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

log = logging.getLogger(__name__)

#: Events kept in memory for ``GET /v1/events``.
KEEP = 1000


class _Event(BaseModel):
    """Shared settings (no fields: each kind lists its keys in file order)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def to_record(self) -> dict[str, Any]:
        """The event as its JSON object: the keys given, in declaration order, then extras."""
        return self.model_dump(exclude_unset=True)

    def details(self) -> dict[str, Any]:
        """:meth:`to_record` without ``time``, ``node`` and ``kind``."""
        record = self.to_record()
        for key in ("time", "node", "kind"):
            record.pop(key, None)
        return record


class _RankEvent(_Event):
    """The keys every event starts with: when (Unix s), where, what, which rank and process."""

    time: float
    node: str
    kind: str
    job: str
    rank: int
    pid: int | None = None


class RankExitEvent(_RankEvent):
    """A rank's process ended (see the module docstring for each key)."""

    kind: Literal["rank_exit"] = "rank_exit"
    clean: bool | None = None
    replaced: bool | None = None
    exit_code: int | None = None
    exit_signal: str | None = None
    reason: Literal["finished", "stopped", "exit_code", "signal", "unknown"] | None = None


class RankHangEvent(_RankEvent):
    """A running rank's heartbeat is older than its threshold (seconds; FC-10); ``phase``:
    the phase it was stuck in past ``phase_deadline`` (Unix s), e.g. a start-up stage
    (``rendezvous``, ``mesh``, ``parallelize``, ``checkpoint_load``), or none."""

    kind: Literal["rank_hang"] = "rank_hang"
    heartbeat: float | None = None
    age_seconds: float | None = None
    threshold_seconds: float | None = None
    median_step_seconds: float | None = None
    warming_up: int | None = None  # 1: the rank's process had not completed its warm-up steps
    step: float | None = None
    phase: str | None = None
    phase_deadline: float | None = None
    collective_calls: float | None = None
    collective_lag: float | None = None
    behind_rank: int | None = None
    diagnostics: str | None = None


class RankHangCulpritEvent(_RankEvent):
    """The hung job's flight recorders name ``rank`` as the culprit (``pid``: its process):
    ``method`` (``flight_recorder``), ``certain``, the ``evidence`` lines, the ranks
    ``asked`` for a dump and those that ``answered``, and the ``diagnostics`` folder
    (:mod:`stormwatch.agent.watch.hangdumps`). At most one per hang of a job."""

    kind: Literal["rank_hang_culprit"] = "rank_hang_culprit"
    method: str | None = None
    certain: bool | None = None
    evidence: list[str] | None = None
    asked: list[int] | None = None
    answered: list[int] | None = None
    diagnostics: str | None = None


class RankOrphanedEvent(_RankEvent):
    """A process of the rank (``pid``) runs without its launcher (torchrun, the step
    daemon): adopted by ``parent_pid`` (1: init), started at ``started_at`` (Unix s)
    (:mod:`stormwatch.agent.watch.orphans`). Its end is the rank's ``rank_exit``."""

    kind: Literal["rank_orphaned"] = "rank_orphaned"
    parent_pid: int | None = None
    started_at: float | None = None


class RankHangClearedEvent(_RankEvent):
    """A hang ended: the rank stepped again (``progress``), ``exited`` or was ``forgotten``."""

    kind: Literal["rank_hang_cleared"] = "rank_hang_cleared"
    reason: Literal["progress", "exited", "forgotten"] | None = None
    step: float | None = None


class _StragglerScores(_RankEvent):
    """A straggler detector's view of one step (FC-14; times in seconds)."""

    step: float | None = None
    score: float | None = None
    compute_seconds: float | None = None
    wait_seconds: float | None = None
    peers_median_compute_seconds: float | None = None
    peers_median_wait_seconds: float | None = None


class RankStragglerEvent(_StragglerScores):
    """A rank's compute was slow for several steps in a row."""

    kind: Literal["rank_straggler"] = "rank_straggler"


class RankStragglerClearedEvent(_StragglerScores):
    """A straggler stepped at its peers' pace again (the step's scores), or is ``gone``
    (``reason``, without scores)."""

    kind: Literal["rank_straggler_cleared"] = "rank_straggler_cleared"
    reason: Literal["gone"] | None = None


#: One line of ``events.jsonl`` (one event of ``/v1/events``), by its ``kind``.
AgentEvent = Annotated[
    RankExitEvent
    | RankOrphanedEvent
    | RankHangEvent
    | RankHangCulpritEvent
    | RankHangClearedEvent
    | RankStragglerEvent
    | RankStragglerClearedEvent,
    Field(discriminator="kind"),
]
_AGENT_EVENT: TypeAdapter[AgentEvent] = TypeAdapter(AgentEvent)


def parse_agent_event(line: str) -> AgentEvent:
    """One line as its event.

    Raises:
        ValueError: (pydantic's ``ValidationError``) not JSON, an unknown ``kind``, a
            missing ``time``/``node``/``job``/``rank``, or a wrongly typed key.
    """
    return _AGENT_EVENT.validate_json(line)


def parse_agent_events(lines: list[str]) -> list[AgentEvent]:
    """The events of ``lines``, in order; a line that is not an event is skipped."""
    events: list[AgentEvent] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            events.append(parse_agent_event(line))
        except ValidationError:
            continue  # a torn last line while the agent appends, or another version's kind
    return events


def read_agent_events(path: Path) -> list[AgentEvent]:
    """Every event of an ``events.jsonl`` file (see :func:`parse_agent_events`).

    Raises:
        OSError: the file cannot be read.
    """
    return parse_agent_events(path.read_text(encoding="utf-8", errors="replace").splitlines())


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
        self._events: collections.deque[AgentEvent] = collections.deque(maxlen=KEEP)
        self._load()

    def _load(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()[-KEEP:]
        except OSError:
            return
        self._events.extend(parse_agent_events(lines))

    def record(self, kind: str, job: str, rank: int, **details: Any) -> AgentEvent:
        """Append one event (timestamped now) and return it.

        Raises:
            ValueError: ``kind`` or a detail is not one the model declares for it, or is
                wrongly typed (a programming error; I/O failures are only logged).
        """
        event = _AGENT_EVENT.validate_python(
            {
                "time": self._clock(),
                "node": self._node,
                "kind": kind,
                "job": job,
                "rank": rank,
                **details,
            }
        )
        if event.model_extra:
            raise ValueError(f"{kind}: unknown detail(s) {sorted(event.model_extra)}")
        line = json.dumps(event.to_record(), default=str)
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
    ) -> list[AgentEvent]:
        """Events in time order, optionally after ``since`` (Unix s) / of one kind / job."""
        with self._lock:
            return [
                e
                for e in self._events
                if (since is None or e.time > since)
                and (kind is None or e.kind == kind)
                and (job is None or e.job == job)
            ]


__all__ = [
    "KEEP",
    "AgentEvent",
    "EventLog",
    "RankExitEvent",
    "RankHangClearedEvent",
    "RankHangCulpritEvent",
    "RankHangEvent",
    "RankOrphanedEvent",
    "RankStragglerClearedEvent",
    "RankStragglerEvent",
    "parse_agent_event",
    "parse_agent_events",
    "read_agent_events",
]
