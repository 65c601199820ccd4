"""Per-rank post-mortem dumps on hang, collective timeout, fatal error or termination (FC-10).

When a rank's training ends abnormally it writes
``<dump-dir>/rank<R>.attempt<A>.pid<P>.json`` (``--dump-dir``, default
``<log-dir>/dumps``; :func:`dump_path`): one file per worker incarnation, so a restarted
attempt keeps the dumps of the attempts before it (``A`` is the node's restart count,
which a restart caused by a peer node does not raise: the pid tells those apart). A later
dump of the same process (an error, then its SIGTERM) replaces its own file, except the
answer to the node agent's dump request, taken while a hang lasts, which has its own,
``rank<R>.attempt<A>.pid<P>.requested.json`` (a later request replaces it): the dump at
the stop that follows (SIGTERM) may no longer show the hang (a framework's SIGTERM handler
on the hung rank issued a collective, a stopped rank ran on), and the post-mortem compares
the dumps taken before the stop (:func:`stormwatch.postmortem.incident_dumps`).
Older writers wrote one ``rank<R>.json`` per rank, overwritten by every attempt; the
readers read both names::

    {"rank", "attempt", "pid", "time", "reason", "errno", "step", "phase",
     "flight_recorder": {...} | null, "flight_recorder_error": str | null,
     "collectives": [...]}

* ``errno``: when an exception ended training, the errno of the system call that failed
  (:func:`stormwatch.ports.error_errno`: an ``OSError`` in its cause chain, or the
  ``code: -N`` torch's c10d writes into a ``DistNetworkError``), e.g. 98 (``EADDRINUSE``)
  for a store that could not listen on its port; ``null`` otherwise (addition).

* ``phase``: the phase the rank was in when it dumped (the innermost of those
  entered), e.g. the start-up stage ``mesh`` of a rank that never reached its
  first step; ``null`` outside every phase (addition).

* ``flight_recorder``: PyTorch's flight recorder
  (``torch._C._distributed_c10d._dump_fr_trace_json``), parsed. In torch
  2.13 it records gloo collectives as well as NCCL ones when
  ``TORCH_FR_BUFFER_SIZE`` (older name: ``TORCH_NCCL_TRACE_BUFFER_SIZE``) is
  set before the process group is created; ``stormwatch train`` sets it
  (``--flight-recorder-entries``, default 2000) unless already set. Each
  entry has ``collective_seq_id``, ``profiling_name`` (e.g.
  ``gloo:all_reduce``), ``pg_id``, ``process_group`` (``[name, desc]``), sizes and
  ``state``; ``pg_status`` gives each group's last enqueued / completed sequence
  number, which is what a post-mortem compares across ranks to find the one that
  never joined. ``pg_status`` is keyed by the rank's own group index: readers compare
  groups by name (:meth:`DumpRecord.group_status`).
* ``collectives``: the last collectives seen by our collective counter
  (:meth:`~stormwatch.telemetry.comms.CollectiveCounter.recent`), with mesh
  dimension and ``seconds: null`` for those never observed complete.

On GPU, NCCL's own watchdog also dumps its flight recorder on a timeout to
``<dump-dir>/nccl_trace_rank_<R>`` (``TORCH_FR_DUMP_TEMP_FILE``, set by the
CLI). Writing a dump never raises. No torch import at module level.

The file's one model is :class:`DumpRecord` (the writer fills it); readers (the
incident post-mortem, the agent's hang diagnosis) load dumps with :func:`read_dumps`
(the latest per rank), :func:`read_all_dumps` (every attempt's), :func:`latest_dump` and
:func:`read_dump`, and
read the flight recorder's per-group counters through :meth:`DumpRecord.group_status`
and unfinished collectives through :meth:`DumpRecord.in_collective`. Importing this
module does not import torch (a test checks it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, ValidationError

from stormwatch.ports import error_errno

log = logging.getLogger(__name__)

#: Flight-recorder ring size: ~60 steps of the default model's ~33 collectives.
DEFAULT_FLIGHT_RECORDER_ENTRIES = 2000
#: The largest ring accepted: PyTorch keeps every entry in host memory (a few hundred
#: bytes to ~1 KiB each, with its stack) and reads them all into the SIGTERM dump, so
#: 1,000,000 entries (~1 GiB, ~30,000 steps of the default model) is far past any use;
#: sizes near 2**63 make torch fail to allocate or hang.
MAX_FLIGHT_RECORDER_ENTRIES = 1_000_000


def _int_or_none(value: object) -> int | None:
    """An int, or the digits torch writes as a string (``"55"``, ``"-1"``); anything else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,30}", value):
        return int(value)  # not isdigit(): it takes "--5" and "²", which int() refuses
    return None


#: An integer field that reads what is not one as None (dumps come from a dying process).
LenientInt = Annotated[int | None, BeforeValidator(_int_or_none)]
#: The default process group's key (:meth:`DumpRecord.group_status`): torch gives it
#: ``pg_id`` 0, the name ``"0"`` and the description ``"default_pg"`` on every rank.
DEFAULT_GROUP = "default_pg:0"

#: A text field that reads null as "".
LenientText = Annotated[str, BeforeValidator(lambda v: "" if v is None else str(v))]


class GroupStatus(BaseModel):
    """One process group's counters in the flight recorder's ``pg_status`` (collective
    sequence numbers, which torch writes as strings; -1: none yet)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    last_enqueued_collective: LenientInt = None
    last_completed_collective: LenientInt = None


class DumpRecord(BaseModel):
    """One rank's dump, ``<dump-dir>/rank<R>.attempt<A>.pid<P>.json`` (older:
    ``rank<R>.json``; keys in file order; see the module docstring).

    Attributes:
        rank / attempt / pid: who wrote it (``attempt``: TORCHELASTIC_RESTART_COUNT).
        time: when (Unix seconds).
        reason: why (the exception or signal that ended training).
        errno: the errno of the failed system call behind that exception (e.g. 98,
            ``EADDRINUSE``), None when there was none.
        step: the step in progress, if any.
        phase: the phase (e.g. a start-up stage: ``rendezvous``, ``mesh``, ``parallelize``,
            ``checkpoint_load``) the rank was in, if any.
        flight_recorder: PyTorch's flight recorder JSON as dumped (None when unavailable).
        flight_recorder_error: why it is unavailable.
        collectives: our own record of the last collectives (``seconds`` None: never
            observed complete), or one ``{"error": ...}`` when it could not be read.
    """

    model_config = ConfigDict(extra="ignore")

    rank: StrictInt
    attempt: LenientInt = None
    pid: LenientInt = None
    time: float | None = None
    reason: LenientText = ""
    errno: LenientInt = None
    step: LenientInt = None
    phase: str | None = None
    flight_recorder: Any = None
    flight_recorder_error: str | None = None
    collectives: list[Any] = Field(default_factory=list)

    def group_status(self) -> dict[str, GroupStatus]:
        """Process group -> its flight-recorder counters (groups without a readable entry
        are left out), keyed so that one key means one group on every rank.

        ``pg_status`` is keyed by the process's own group index (``pg_id``: the order in
        which *this* rank created its groups), so in a dp=2 x tp=2 mesh rank 2's ``"1"`` and
        rank 3's ``"1"`` are two different data-parallel groups. The recorder's entries give
        each ``pg_id`` its group's name, which every member shares: such a group is keyed
        ``"<desc>:<name>"`` (e.g. ``"mesh_tp:4"``, ``"default_pg:0"``). Index ``"0"`` is the
        default group on every rank (torch creates it first), so it is keyed so without an
        entry too. Any other group whose entries left the ring (its collectives are older
        than the ring's last ``TORCH_FR_BUFFER_SIZE``) is keyed ``"rank<R>/pg<index>"``: this
        rank's alone, never compared with another rank's, while still telling whether the
        rank waits inside one of its collectives.
        """
        recorder = self.flight_recorder if isinstance(self.flight_recorder, dict) else {}
        raw = recorder.get("pg_status") or {}
        if not isinstance(raw, dict):
            return {}
        names = _group_names(recorder.get("entries"))
        names.setdefault("0", DEFAULT_GROUP)
        return {
            names.get(str(key), f"rank{self.rank}/pg{key}"): GroupStatus.model_validate(status)
            for key, status in raw.items()
            if isinstance(status, dict)
        }

    def in_collective(self) -> bool:
        """A collective of our own record was never observed complete (``seconds`` null)."""
        return any(isinstance(c, dict) and c.get("seconds", 0.0) is None for c in self.collectives)


def _group_names(entries: object) -> dict[str, str]:
    """``pg_id`` -> ``"<desc>:<name>"`` from flight-recorder entries (each has ``pg_id`` and
    ``process_group: [name, desc]``; torch's FlightRecorder, 2.6 to 2.13)."""
    names: dict[str, str] = {}
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict):
            continue
        pg_id, group = entry.get("pg_id"), entry.get("process_group")
        if pg_id is None or not isinstance(group, list) or not group:
            continue
        name = str(group[0])
        desc = str(group[1]) if len(group) > 1 and group[1] else "group"
        names.setdefault(str(pg_id), f"{desc}:{name}")
    return names


def read_dump(path: Path) -> DumpRecord:
    """Read one dump file.

    Raises:
        OSError: it cannot be read.
        ValueError: it is not a dump (not JSON, or no integer ``rank``).
    """
    return DumpRecord.model_validate_json(Path(path).read_text(encoding="utf-8"))


#: A dump file last modified this long before ``since`` is not parsed at all (its record's
#: own ``time`` decides for the others): old attempts' dumps stay in the folder.
MTIME_SLACK_S = 60.0


def _read_quietly(path: Path) -> DumpRecord | None:
    """The dump in ``path``; None (logged in one short line) when it cannot be read or is
    no dump (not a regular file, not UTF-8, not JSON, not a dump's fields)."""
    try:
        if not path.is_file():  # a folder or a FIFO named rank*.json: never open it
            return None
        return read_dump(path)
    except OSError as exc:
        log.warning("dump %s unreadable: %s", path, exc)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[:1]
        what = f"{first[0]['type']} at {first[0]['loc']}" if first else "invalid"
        log.warning("dump %s unreadable: %s", path, what)
    except ValueError as exc:  # not UTF-8
        log.warning("dump %s unreadable: %s", path, type(exc).__name__)
    return None


def _fresh(path: Path, since: float) -> bool:
    """Whether ``path`` may hold a dump written at or after ``since`` (its mtime says so)."""
    try:
        return path.stat().st_mtime >= since - MTIME_SLACK_S
    except OSError:
        return False


def read_all_dumps(dump_dir: Path, since: float, until: float | None = None) -> list[DumpRecord]:
    """Every dump in ``dump_dir`` written at or after ``since`` and, with ``until``, at or
    before it (Unix s), of every attempt and both names (``rank<R>.attempt<A>.pid<P>.json``,
    the older ``rank<R>.json``), by time then file name; a dump whose time is unknown or
    not finite is left out; an unreadable file is logged and skipped, a missing folder
    reads as empty. A file's own ``rank`` field, not its name, says whose dump it is."""
    paths = sorted(p for p in Path(dump_dir).glob("rank*.json") if _fresh(p, since))
    kept = [
        d
        for d in (_read_quietly(path) for path in paths)
        if d is not None
        and d.time is not None
        and math.isfinite(d.time)
        and d.time >= since
        and (until is None or d.time <= until)
    ]
    return sorted(kept, key=lambda d: d.time or 0.0)


def read_dumps(dump_dir: Path, since: float, until: float | None = None) -> dict[int, DumpRecord]:
    """rank -> its latest dump in ``dump_dir`` written between ``since`` and ``until``
    (Unix s) (:func:`read_all_dumps`, the last attempt's per rank)."""
    return {record.rank: record for record in read_all_dumps(dump_dir, since, until)}


def dump_path(
    dump_dir: Path,
    rank: int,
    *,
    attempt: int | None = None,
    pid: int | None = None,
    requested: bool = False,
) -> Path:
    """``<dump_dir>/rank<R>.attempt<A>.pid<P>.json``, one worker incarnation's dump
    (``...pid<P>.requested.json`` with ``requested``: its answer to a dump request); without
    ``attempt`` and ``pid``, ``<dump_dir>/rank<R>.json``, the name older writers used for
    every attempt (still read)."""
    if attempt is None and pid is None:
        return dump_dir / f"rank{rank}.json"
    kind = ".requested" if requested else ""
    return dump_dir / f"rank{rank}.attempt{attempt or 0}.pid{pid or 0}{kind}.json"


def rank_dump_paths(dump_dir: Path, rank: int) -> list[Path]:
    """Every dump file of ``rank`` in ``dump_dir`` (both names), by name."""
    folder = Path(dump_dir)
    paths = [*folder.glob(f"rank{rank}.attempt*.json"), dump_path(folder, rank)]
    return sorted(p for p in paths if p.is_file())


def latest_dump(dump_dir: Path, rank: int, since: float) -> DumpRecord | None:
    """``rank``'s newest dump in ``dump_dir`` written at or after ``since`` (Unix s); None
    when there is none yet (a file being replaced, or not a dump, is skipped silently)."""
    found: list[DumpRecord] = []
    for path in rank_dump_paths(dump_dir, rank):
        if not _fresh(path, since):  # an earlier attempt's: not parsed on every poll
            continue
        try:
            record = read_dump(path)
        except (OSError, ValueError):  # being replaced, or not a dump
            continue
        if (record.time or 0.0) >= since and record.rank == rank:
            found.append(record)
    return max(found, key=lambda d: d.time or 0.0, default=None)


def _describe(error: BaseException) -> tuple[int | None, str]:
    """(errno, "Type: message") of ``error``; an exception whose ``str()`` raises is named
    by its type alone (a dump is still written)."""
    try:
        errno = error_errno(error)
    except Exception:
        errno = None
    try:
        text = f"{type(error).__name__}: {error}"
    except Exception:
        text = f"{type(error).__name__} (its message could not be read)"
    return errno, text


def flight_recorder_environ(dump_dir: Path | None, entries: int) -> dict[str, str]:
    """Variables that enable the flight recorder; set them before the process group exists.

    Returns only the names not already chosen by the user (``TORCH_FR_BUFFER_SIZE``
    or ``TORCH_NCCL_TRACE_BUFFER_SIZE`` set means the user decided).
    """
    out: dict[str, str] = {}
    if entries > 0 and not (
        os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    ):
        out["TORCH_FR_BUFFER_SIZE"] = str(entries)
    if dump_dir is not None and not os.environ.get("TORCH_FR_DUMP_TEMP_FILE"):
        out["TORCH_FR_DUMP_TEMP_FILE"] = str(dump_dir / "nccl_trace_rank_")
    return out


def _flight_recorder() -> tuple[Any, str | None]:
    try:
        import torch._C._distributed_c10d as c10d

        # Private API, present in torch 2.13 (the .pyi stub omits it).
        raw = c10d._dump_fr_trace_json(True, False)  # type: ignore[attr-defined]
        return json.loads(raw), None
    except Exception as exc:  # absent in this build, recorder off, ...
        return None, f"{type(exc).__name__}: {exc}"


class RankDumper:
    """Writes this rank's post-mortem dump; never raises.

    Args:
        dump_dir: folder (created on first dump); ``None`` disables dumps.
        rank: global rank.
        attempt: torchrun restart count.
        recent: returns the latest collectives (JSON-ready dicts).
        clock: Unix time source.
    """

    def __init__(
        self,
        dump_dir: Path | None,
        *,
        rank: int,
        attempt: int,
        recent: Callable[[], list[dict[str, Any]]] = list,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._dir = dump_dir
        self._rank = rank
        self._attempt = attempt
        self._clock = clock
        self.recent = recent
        self.step: int | None = None  # set by the loop: the step in progress
        self.phase: str | None = None  # set by the session: the phase the rank is in

    def dump(self, reason: str | BaseException, *, requested: bool = False) -> Path | None:
        """Write this incarnation's dump (:func:`dump_path`; ``requested``: the answer to a
        dump request, in a file of its own) with ``reason``: a text, or the exception that
        ended training (its type and message, and its ``errno``); returns its path, or
        ``None``."""
        if self._dir is None:
            return None
        errno = None
        if isinstance(reason, BaseException):
            errno, reason = _describe(reason)
        try:
            recorder, recorder_error = _flight_recorder()
            try:
                collectives = self.recent()
            except Exception as exc:
                collectives = [{"error": f"{type(exc).__name__}: {exc}"}]
            record = DumpRecord(
                rank=self._rank,
                attempt=self._attempt,
                pid=os.getpid(),
                time=self._clock(),
                reason=reason,
                errno=errno,
                step=self.step,
                phase=self.phase,
                flight_recorder=recorder,
                flight_recorder_error=recorder_error,
                collectives=collectives,
            )
            self._dir.mkdir(parents=True, exist_ok=True)
            path = dump_path(
                self._dir, self._rank, attempt=self._attempt, pid=os.getpid(), requested=requested
            )
            text = json.dumps(record.model_dump(), default=str)
            # a temp name of its own per write (two dumps at once in one process: the
            # SIGTERM thread and a dump request), so no reader sees a torn file
            handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=self._dir)
            os.fchmod(handle, 0o644)  # readable as before (mkstemp makes it 0600)
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as out:
                    out.write(text)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):  # already replaced or gone: nothing left
                    os.unlink(tmp)
                raise
            log.warning("rank %d: post-mortem dump (%s) written to %s", self._rank, reason, path)
            return path
        except Exception:
            log.exception("rank %d: could not write the post-mortem dump", self._rank)
            return None


__all__ = [
    "DEFAULT_FLIGHT_RECORDER_ENTRIES",
    "MAX_FLIGHT_RECORDER_ENTRIES",
    "DumpRecord",
    "GroupStatus",
    "RankDumper",
    "dump_path",
    "flight_recorder_environ",
    "latest_dump",
    "rank_dump_paths",
    "read_all_dumps",
    "read_dump",
    "read_dumps",
]
