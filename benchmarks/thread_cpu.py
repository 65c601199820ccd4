"""CPU time of this process's threads, by thread name (for the benchmarks' "where the CPU
goes" rows).

A Python thread's time comes from its own CPU clock (``pthread_getcpuclockid``:
nanoseconds); a thread Python did not start (gloo's, torch's intra-op pool, gRPC's) from
``/proc/self/task/<tid>/stat`` (utime + stime, clock ticks: 10 ms, so only sums over
seconds of running mean anything), named by its ``comm`` with "(native)" after it.
Numbers in names are replaced by ``N`` so that a thread started again in each trial
(``Thread-7 (run)``, ``Thread-12 (run)``) adds to one row. Linux only.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path

_DIGITS = re.compile(r"\d+")


def _ticks(tid: int, per_second: int) -> float | None:
    try:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # ended meanwhile
        return None
    return (int(fields[11]) + int(fields[12])) / per_second


#: One snapshot: thread id -> (row name, CPU seconds used so far).
Snapshot = dict[int, tuple[str, float]]


def cpu_by_thread(main_name: str = "main thread") -> Snapshot:
    """CPU seconds used so far by each live thread (user + system, since it started).

    Args:
        main_name: the row of the main thread (``threading.main_thread()``).

    Returns:
        thread id -> (its row name, CPU seconds); compare two with :func:`difference`.
    """
    per_second = os.sysconf("SC_CLK_TCK")
    python = {t.native_id: t for t in threading.enumerate()}
    main = threading.main_thread()
    out: Snapshot = {}
    for entry in os.listdir("/proc/self/task"):
        tid = int(entry)
        thread = python.get(tid)
        seconds: float | None = None
        if thread is not None and thread.ident is not None:
            name = main_name if thread is main else _DIGITS.sub("N", thread.name)
            with contextlib.suppress(OSError, OverflowError):
                seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        else:
            try:
                comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            except OSError:
                continue
            name = f"{_DIGITS.sub('N', comm)} (native)"
        if seconds is None:
            seconds = _ticks(tid, per_second)
        if seconds is not None:
            out[tid] = (name, seconds)
    return out


def difference(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds used between two snapshots, summed by row name: each thread of ``after``
    minus what it had used in ``before`` (a thread started between counts from zero; one
    that ended between is not counted: its last use is unknown)."""
    used: dict[str, float] = {}
    for tid, (name, seconds) in after.items():
        earlier = before.get(tid)
        spent = seconds - (earlier[1] if earlier is not None else 0.0)
        used[name] = used.get(name, 0.0) + spent
    return used


__all__ = ["Snapshot", "cpu_by_thread", "difference"]
