"""What the rank watcher (:mod:`.ranks`) reports: one rank as it sees it, and one exit."""

from __future__ import annotations

import dataclasses

from stormwatch.agent.watch.proc_exits import signal_name


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


__all__ = ["RankExit", "RankInfo"]
