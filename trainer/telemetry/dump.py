"""Per-rank post-mortem dumps on hang, collective timeout, fatal error or termination (FC-10).

When a rank's training ends abnormally it writes ``<dump-dir>/rank<R>.json``
(``--dump-dir``, default ``<log-dir>/dumps``; a restarted attempt overwrites
the file with ``attempt`` recorded in it)::

    {"rank", "attempt", "pid", "time", "reason", "step",
     "flight_recorder": {...} | null, "flight_recorder_error": str | null,
     "collectives": [...]}

* ``flight_recorder``: PyTorch's flight recorder
  (``torch._C._distributed_c10d._dump_fr_trace_json``), parsed. In torch
  2.13 it records gloo collectives as well as NCCL ones when
  ``TORCH_FR_BUFFER_SIZE`` (older name: ``TORCH_NCCL_TRACE_BUFFER_SIZE``) is
  set before the process group is created; ``stormwatch train`` sets it
  (``--flight-recorder-entries``, default 2000) unless already set. Each
  entry has ``collective_seq_id``, ``profiling_name`` (e.g.
  ``gloo:all_reduce``), ``process_group``, sizes and ``state``; ``pg_status``
  gives each group's last enqueued / completed sequence number, which is
  what a post-mortem compares across ranks to find the one that never
  joined.
* ``collectives``: the last collectives seen by our collective counter
  (:meth:`~stormwatch.trainer.telemetry.comms.CollectiveCounter.recent`), with mesh
  dimension and ``seconds: null`` for those never observed complete.

On GPU, NCCL's own watchdog also dumps its flight recorder on a timeout to
``<dump-dir>/nccl_trace_rank_<R>`` (``TORCH_FR_DUMP_TEMP_FILE``, set by the
CLI). Writing a dump never raises. No torch import at module level.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Flight-recorder ring size: ~60 steps of the default model's ~33 collectives.
DEFAULT_FLIGHT_RECORDER_ENTRIES = 2000


def dump_path(dump_dir: Path, rank: int) -> Path:
    """``<dump_dir>/rank<rank>.json``."""
    return dump_dir / f"rank{rank}.json"


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

    def dump(self, reason: str) -> Path | None:
        """Write ``rank<R>.json`` with ``reason``; returns its path, or ``None``."""
        if self._dir is None:
            return None
        try:
            recorder, recorder_error = _flight_recorder()
            try:
                collectives = self.recent()
            except Exception as exc:
                collectives = [{"error": f"{type(exc).__name__}: {exc}"}]
            record = {
                "rank": self._rank,
                "attempt": self._attempt,
                "pid": os.getpid(),
                "time": self._clock(),
                "reason": reason,
                "step": self.step,
                "flight_recorder": recorder,
                "flight_recorder_error": recorder_error,
                "collectives": collectives,
            }
            self._dir.mkdir(parents=True, exist_ok=True)
            path = dump_path(self._dir, self._rank)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record, default=str), encoding="utf-8")
            os.replace(tmp, path)
            log.warning("rank %d: post-mortem dump (%s) written to %s", self._rank, reason, path)
            return path
        except Exception:
            log.exception("rank %d: could not write the post-mortem dump", self._rank)
            return None


__all__ = [
    "DEFAULT_FLIGHT_RECORDER_ENTRIES",
    "RankDumper",
    "dump_path",
    "flight_recorder_environ",
]
