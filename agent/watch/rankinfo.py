"""What the rank watcher (:mod:`.ranks`) reports: one rank as it sees it, and one exit,
with the markers that tell how it ended.

``<metrics-dir>/rank<R>.done`` (a clean end, :func:`stormwatch.telemetry.rank.done_marker_path`)
and ``<metrics-dir>/rank<R>.stopping`` (SIGTERM taken as a stop request,
:func:`stormwatch.telemetry.rank.stop_marker_path`; it holds the writer's pid). A marker
belongs to a process when it was written during its life (1 s of slack for the clocks of
``stat`` and ``/proc``) and, when it names a pid, by that process: the folder is the node's,
shared by every job's rank of that number.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Iterable
from pathlib import Path

from stormwatch.agent.watch.proc_exits import signal_name
from stormwatch.contracts.rank_env import RankEnv, RankKey


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """One rank as the watcher sees it (the ``GET /v1/ranks`` rows).

    Attributes:
        job, rank, local_rank, world_size, run_id, restart_count: from the environment.
        pid: the rank's process (the last one, once it exited).
        alive: the process is running.
        started_at, exited_at: Unix times (process start; when the exit was noticed).
        last_step: last ``stormwatch_train_step`` seen.
        last_progress_timestamp: last heartbeat seen (Unix time).
        unexpected_exits: exits without a ``rank<R>.done`` marker.
    """

    job: str
    rank: int
    local_rank: int
    world_size: int
    run_id: str
    restart_count: int | None
    pid: int
    alive: bool
    started_at: float
    exited_at: float | None
    last_step: float | None
    last_progress_timestamp: float | None
    unexpected_exits: int


@dataclasses.dataclass(frozen=True)
class RankExit:
    """An exit the watcher noticed (passed to ``on_exit``).

    ``exit_code``: like ``subprocess``, the exit code or minus the number of the
    signal that killed it; from the proc connector (:mod:`.proc_exits`), else from
    the zombie's ``/proc/<pid>/stat`` when a scan caught one; None when unknown
    (ranks are torchrun's children: it usually reaps them before a scan looks).
    """

    job: str
    rank: int
    pid: int
    clean: bool
    replaced: bool
    exit_code: int | None
    stopped: bool = False

    @property
    def reason(self) -> str:
        """``finished`` (its ``rank<R>.done`` marker, and status 0 when known), ``stopped``
        (asked to stop: its ``rank<R>.stopping`` marker, written at SIGTERM), ``signal``,
        ``exit_code`` or ``unknown``: the ``reason`` label of
        ``stormwatch_rank_exits_total``."""
        if self.clean:
            return "finished"
        if self.stopped:
            return "stopped"
        if self.exit_code is None:
            return "unknown"
        return "signal" if self.exit_code < 0 else "exit_code"

    @property
    def exit_signal(self) -> str | None:
        """``SIGKILL`` ... when a signal killed it, else None."""
        return signal_name(-self.exit_code) if self.exit_code and self.exit_code < 0 else None


def marker_time(
    metrics_dir: Path, rank: int, what: str, *, pid: int, create_time: float
) -> float | None:
    """When ``<metrics_dir>/rank<rank>.<what>`` was written by process ``pid`` (started at
    ``create_time``, Unix s), or None: absent, unreadable, older than the process, or
    written by another pid."""
    marker = metrics_dir / f"rank{rank}.{what}"
    try:
        stamp = marker.stat().st_mtime
        if stamp < create_time - 1.0:
            return None
        written_by = marker.read_text().strip()
    except OSError:
        return None
    return stamp if not written_by.isdigit() or int(written_by) == pid else None


def is_stop(asked: float | None, code: int | None, job: str, heartbeats: Iterable[RankKey]) -> bool:
    """Whether a rank's exit that was not a clean finish was a stop: it was asked to stop
    (``asked``: the time of its stop marker), or it ended by SIGTERM (``code`` as
    :func:`.procs.exit_status`: -15, or 143 from a handler that exits like a shell) in a
    job that uses the telemetry API on the node (``heartbeats``: the ranks whose heartbeat
    was read, with ``job`` among their jobs).

    The second case is a rank stopped before its telemetry started, which could not mark
    the request: torchrun ending the group it had just started for a new rendezvous round
    while a peer node cannot reach the store. A job without the API has no marker at all:
    its SIGTERM exits still count (docs/runbooks.md, StormwatchRankStalled).
    """
    if asked is not None:
        return True
    return code in (-signal.SIGTERM, 128 + signal.SIGTERM) and any(k[0] == job for k in heartbeats)


def exit_attributes(
    env: RankEnv, pid: int, clean: bool, replaced: bool, code: int | None
) -> dict[str, str | int | bool | float]:
    """The attributes of a ``rank.exit`` span (OpenTelemetry ``process.*`` names)."""
    attributes: dict[str, str | int | bool | float] = {
        "stormwatch.job": env.job,
        "stormwatch.rank": env.rank,
        "stormwatch.local_rank": env.local_rank,
        "stormwatch.run_id": env.run_id,
        "process.pid": pid,
        "stormwatch.rank.clean_exit": clean,
        "stormwatch.rank.replaced": replaced,
    }
    if env.restart_count is not None:
        attributes["stormwatch.restart_count"] = env.restart_count
    if code is not None:
        attributes["process.exit.code"] = code
    return attributes


__all__ = ["RankExit", "RankInfo", "exit_attributes", "marker_time"]
