"""``gpu_processes`` collector: GPU memory per rank, never blaming the wrong rank (FC-06).

NVML's process list can be garbage (a binding/driver struct mismatch shuffles
``pid`` and ``usedGpuMemory``). Each entry is checked before it is attributed:
memory must not exceed the GPU's total, the pid must exist, and it must be a
running rank (or a descendant of one) found by the rank watcher under a
torchrun agent. Entries failing a check are counted by reason instead.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Literal

import psutil
from prometheus_client.core import Metric

from stormwatch.agent.collectors.base import new_family
from stormwatch.agent.collectors.gpu import latest_snapshot
from stormwatch.agent.gpu.model import ProcessEntry
from stormwatch.agent.gpu.sampler import GpuSampler
from stormwatch.contracts.rank_env import RankKey

RejectReason = Literal["memory_exceeds_total", "no_such_pid", "not_a_rank"]
REJECT_REASONS: tuple[RejectReason, ...] = ("memory_exceeds_total", "no_such_pid", "not_a_rank")


def pid_exists(pid: int) -> bool:
    """Whether ``pid`` is a live process (False for impossible pids such as 6498025472)."""
    try:
        return pid > 0 and psutil.pid_exists(pid)
    except (OverflowError, ValueError):
        return False


def attribute(
    entry: ProcessEntry,
    *,
    memory_total: int | None,
    rank_of_pid: Callable[[int], RankKey | None],
    exists: Callable[[int], bool] = pid_exists,
) -> RankKey | RejectReason:
    """The rank an NVML process entry belongs to, or why it is rejected."""
    if (
        entry.used_bytes is not None
        and memory_total is not None
        and entry.used_bytes > memory_total
    ):
        return "memory_exceeds_total"
    if not exists(entry.pid):
        return "no_such_pid"
    key = rank_of_pid(entry.pid)
    return "not_a_rank" if key is None else key


class GpuProcessesCollector:
    """Per-rank GPU memory from the sampler's process lists.

    Args:
        sampler: the running sampler (sampling processes).
        rank_of_pid: maps a pid to the running rank it belongs to
            (:meth:`stormwatch.agent.watch.ranks.RankWatcher.rank_of_pid`).
    """

    name = "gpu_processes"

    def __init__(
        self, sampler: GpuSampler, *, rank_of_pid: Callable[[int], RankKey | None]
    ) -> None:
        self._sampler = sampler
        self._rank_of_pid = rank_of_pid

    def collect(self) -> Iterator[Metric]:
        snapshot = latest_snapshot(self._sampler)
        memory = new_family("stormwatch_rank_gpu_memory_used_bytes")
        rejected = new_family("stormwatch_gpu_processes_rejected")
        for device in snapshot.devices:
            if not device.up or device.processes is None:
                continue
            per_rank: collections.Counter[RankKey] = collections.Counter()
            reasons: collections.Counter[str] = collections.Counter()
            for entry in device.processes:
                verdict = attribute(
                    entry, memory_total=device.memory_total_bytes, rank_of_pid=self._rank_of_pid
                )
                if isinstance(verdict, str):
                    reasons[verdict] += 1
                elif entry.used_bytes is not None:
                    per_rank[verdict] += entry.used_bytes
            gpu = str(device.index)
            for (job, rank), used in sorted(per_rank.items()):
                memory.add_metric([job, str(rank), gpu], float(used))
            for reason in REJECT_REASONS:
                rejected.add_metric([gpu, reason], float(reasons[reason]))
        yield from (memory, rejected)


__all__ = ["REJECT_REASONS", "GpuProcessesCollector", "attribute", "pid_exists"]
