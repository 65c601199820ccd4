"""What a fault kind needs from the node it runs on, as seams the agent fills in.

The agent passes its real objects (its rank watcher, its NVML backend, its folders,
``is_torchrun_agent``); tests pass their own. Nothing here imports the agent.

* :class:`RankDirectory`: the ranks of this node (the agent's ``RankWatcher``), with those
  whose launcher is gone (:class:`Orphans`);
* :class:`StopProcesses`: the one stop sequence (SIGTERM, grace, SIGKILL, confirmed gone);
* :class:`SimulatedGpus`: the simulated GPU backend the GPU kinds act on (the agent's
  ``FakeNvml``), with the :class:`SimulatedGpu` and :class:`SimulatedLink` it holds;
* :class:`FaultContext`: all of it, handed to every ``prepare``/``inject``/``revert``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil


class _RankProcess(Protocol):
    """A process of one rank of a job: what every view of a rank names."""

    @property
    def job(self) -> str: ...

    @property
    def rank(self) -> int: ...

    @property
    def pid(self) -> int: ...


class RankSeen(_RankProcess, Protocol):
    """One rank as the node's rank directory sees it (the agent's ``RankInfo``)."""

    @property
    def alive(self) -> bool: ...

    @property
    def started_at(self) -> float:
        """The process's start time (Unix seconds, ``psutil.Process.create_time``)."""
        ...


class OrphanSeen(_RankProcess, Protocol):
    """A rank process that outlived its launcher (the agent's ``OrphanInfo``)."""

    @property
    def create_time(self) -> float: ...


class Orphans(Protocol):
    """The rank processes of this node no launcher is above (the agent's ``OrphanTracker``)."""

    def orphans(self) -> Sequence[OrphanSeen]: ...


class StopResult(Protocol):
    """What one stop did (:class:`stormwatch.platforms.stopping.Stopped`)."""

    @property
    def killed(self) -> tuple[int, ...]: ...

    @property
    def left(self) -> tuple[int, ...]: ...

    def describe(self) -> str: ...


class StopProcesses(Protocol):
    """SIGTERM, the grace period, SIGKILL, confirmed gone
    (:func:`stormwatch.platforms.stopping.stop_processes`, which the agent passes)."""

    def __call__(self, procs: Iterable[psutil.Process], *, grace_s: float) -> StopResult: ...


class RankDirectory(Protocol):
    """What faults need from the rank watcher."""

    @property
    def orphaned(self) -> Orphans:
        """The ranks whose launcher is gone, as of the last :meth:`scan`."""
        ...

    def alive(
        self, rank: int, job: str | None = None
    ) -> Sequence[tuple[RankSeen, psutil.Process]]: ...

    def scan(self) -> None: ...

    def check_owned(self, pid: int, create_time: float, key: tuple[str, int]) -> str | None:
        """None when ``pid`` is still this node's rank ``key`` (``(job, rank)``), else why not."""
        ...

    def ranks(self) -> Sequence[RankSeen]: ...

    def note_fault_signal(self, pid: int, *, sent: bool = True) -> None:
        """A fault is about to signal ``pid``: its exit is a failure, even a SIGTERM's that
        the rank takes for a stop request (``sent=False``: it could not be sent after all)."""
        ...


class SimulatedLink(Protocol):
    """One simulated NVLink link: ``active`` (link state), ``errors`` (cumulative counters by
    name: ``crc_flit``, ``crc_data``, ``replay``, ``recovery``)."""

    active: bool

    @property
    def errors(self) -> dict[str, int]: ...


class SimulatedGpu(Protocol):
    """One simulated GPU: ``lost`` (off the bus), ``counters`` (ECC and other error counters by
    name), ``forced_clock_events`` (``nvmlClocksEventReason*`` bits OR-ed in), ``links``."""

    lost: bool
    forced_clock_events: int

    @property
    def counters(self) -> dict[str, int]: ...

    @property
    def links(self) -> Sequence[SimulatedLink]: ...


class SimulatedGpus(Protocol):
    """The simulated GPU backend (the agent's ``FakeNvml``)."""

    @property
    def gpus(self) -> Sequence[SimulatedGpu]: ...

    def emit_xid(self, index: int, code: int) -> None:
        """Queue an XID event of GPU ``index`` for the next NVML event read."""
        ...

    def lose_gpu(self, index: int, lost: bool = True) -> None:
        """GPU ``index`` falls off the bus (every NVML call for it fails), or comes back."""
        ...

    def pending_events(self) -> int:
        """Events queued and not read by the agent yet."""
        ...


def _no_gpu() -> Any:
    return None


def _no_simulation() -> SimulatedGpus | None:
    return None


@dataclasses.dataclass(frozen=True)
class FaultContext:
    """The node-side resources a fault may act on.

    Attributes:
        node: this agent's node name.
        ranks: the rank directory.
        is_launcher: ``is_launcher(name, cmdline)``: whether a process is a torchrun
            (elastic agent) launcher (the agent's ``is_torchrun_agent``).
        metrics_dir: the node's metrics folder (``--metrics-dir``; trainer control files
            live in ``<metrics-dir>/control``), None when unknown.
        state_dir: the agent's state folder (scratch space of faults: overlay upper dirs).
        gpu: returns the agent's NVML backend (``pynvml`` or a simulation), None before
            it is open or without GPU collectors.
        simulated_gpus: returns the simulated GPU backend when the NVML backend is one,
            else None.
        stop_processes: how processes are stopped (the one stop sequence of
            :mod:`stormwatch.platforms.stopping`); None: a fault that must stop processes
            (reaping a kill's orphans) fails with a :class:`~.errors.FaultError`.
    """

    node: str
    ranks: RankDirectory
    is_launcher: Callable[[str, Sequence[str]], bool]
    metrics_dir: Path | None = None
    state_dir: Path | None = None
    gpu: Callable[[], Any] = _no_gpu
    simulated_gpus: Callable[[], SimulatedGpus | None] = _no_simulation
    stop_processes: StopProcesses | None = None


__all__ = [
    "FaultContext",
    "OrphanSeen",
    "Orphans",
    "RankDirectory",
    "RankSeen",
    "SimulatedGpu",
    "SimulatedGpus",
    "SimulatedLink",
    "StopProcesses",
    "StopResult",
]
