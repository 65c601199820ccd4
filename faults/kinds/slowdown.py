"""``cpu_throttle``: a rank (with its descendants) gets ``cpu_fraction`` of one CPU.

Models a noisy neighbour, a throttled host CPU, a misconfigured CPU quota in a
container. The rank becomes a compute straggler (FC-14), the others wait for it.
Mechanism (``method: auto`` picks the first available): cgroup v2 (a dedicated
cgroup ``stormwatch-faults/<tag>`` with ``cpu.max``), cgroup v1
(``cpu.cfs_quota_us``), else a SIGSTOP/SIGCONT duty cycle (100 ms period, a
thread of the agent, ended at the TTL). The original cgroup of each process is
recorded; revert moves them back, removes the cgroup and checks it is gone.
(The trainer's own slowdowns are ``trainer_fault``: :mod:`.trainer`.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import Field

from stormwatch.faults.base import Fault, FaultRequest, Injection
from stormwatch.faults.errors import FaultError
from stormwatch.faults.kind import DetectClass, FaultKind, Placement, Target, Traits
from stormwatch.faults.limits import JobName, Rank
from stormwatch.faults.node import FaultContext
from stormwatch.faults.system import (
    process_ref,
    rank_process,
    same_process,
    short_tag,
    wait_continued,
    wait_until,
)
from stormwatch.faults.targeting import RankTarget

log = logging.getLogger(__name__)

#: cgroup v2 / v1 mount points tried, and the folder holding the faults' cgroups.
CGROUP2_ROOT = Path("/sys/fs/cgroup")
CGROUP2_UNIFIED = Path("/sys/fs/cgroup/unified")
CGROUP1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_PARENT = "stormwatch-faults"
#: Scheduling period of the quota and of the duty cycle, microseconds (the kernel's default).
PERIOD_US = 100_000


class CpuThrottleRequest(FaultRequest):
    """``cpu_throttle``: ``rank``, ``job``, ``cpu_fraction`` (of one CPU), ``method``."""

    kind: Literal["cpu_throttle"]
    rank: Rank
    job: JobName | None = None
    cpu_fraction: float = Field(gt=0, lt=64)
    method: Literal["auto", "cgroup", "duty_cycle"] = "auto"


def _rank_processes(ctx: FaultContext, rank: int, job: str | None) -> list[psutil.Process]:
    process = rank_process(ctx, rank, job)
    return [process, *process.children(recursive=True)]


def _cgroup_root() -> tuple[str, Path] | None:
    """(``v2`` | ``v1``, folder) of a usable CPU controller, or None."""
    for root in (CGROUP2_ROOT, CGROUP2_UNIFIED):
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return "v2", root
    if (CGROUP1_CPU / "cpu.cfs_quota_us").exists():
        return "v1", CGROUP1_CPU
    return None


def _current_cgroup(pid: int, version: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if version == "v2" and number == "0":
            return path
        if version == "v1" and "cpu" in controllers.split(","):
            return path
    return "/"


#: Duty-cycle threads by fault id (see link.py's _FLAPPERS for why a registry).
_CYCLERS: dict[str, threading.Event] = {}
_CYCLERS_LOCK = threading.Lock()


class CpuThrottle(Fault[CpuThrottleRequest]):
    """cgroup CPU quota, or a SIGSTOP/SIGCONT duty cycle."""

    def __init__(self, request: CpuThrottleRequest) -> None:
        super().__init__(request)
        self._targets: list[psutil.Process] = []

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.request
        self._targets = _rank_processes(ctx, spec.rank, spec.job)
        if spec.method == "cgroup" and _cgroup_root() is None:
            raise FaultError("method: no cgroup CPU controller on this node; use duty_cycle")
        if spec.method != "cgroup" and _cgroup_root() is None and spec.cpu_fraction >= 1:
            raise FaultError("cpu_fraction must be below 1 for a duty cycle")

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.request
        root = None if spec.method == "duty_cycle" else _cgroup_root()
        refs = [process_ref(p) for p in self._targets]
        if root is None:
            self._start_cycle(refs)
            return Injection(
                target_pid=int(refs[0][0]), details={"method": "duty_cycle", "processes": refs}
            )
        version, base = root
        folder = base / CGROUP_PARENT / short_tag(spec.id)
        original = {str(int(ref[0])): _current_cgroup(int(ref[0]), version) for ref in refs}
        try:
            if version == "v2":
                # Already delegated, or not ours to change: the writes below say if it matters.
                with contextlib.suppress(OSError):
                    (base / "cgroup.subtree_control").write_text("+cpu")
                (base / CGROUP_PARENT).mkdir(exist_ok=True)
                (base / CGROUP_PARENT / "cgroup.subtree_control").write_text("+cpu")
                folder.mkdir(exist_ok=True)
                quota = max(1000, int(spec.cpu_fraction * PERIOD_US))
                (folder / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            else:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                quota = max(1000, int(spec.cpu_fraction * PERIOD_US))
                (folder / "cpu.cfs_quota_us").write_text(str(quota))
            for ref in refs:
                with contextlib.suppress(ProcessLookupError):  # exited: nothing to throttle
                    (folder / "cgroup.procs").write_text(str(int(ref[0])))
        except OSError as exc:
            partial = {"method": f"cgroup-{version}", "cgroup": str(folder), "original": original}
            try:  # nothing half-applied
                self.revert(ctx, Injection(details={**partial, "processes": refs}))
            except FaultError as undo:
                log.warning("cpu_throttle: undoing the partial cgroup %s failed: %s", folder, undo)
            raise FaultError(f"cpu_throttle: cgroup {folder}: {exc}") from exc
        return Injection(
            target_pid=int(refs[0][0]),
            details={
                "method": f"cgroup-{version}",
                "cgroup": str(folder),
                "quota_us": quota,
                "period_us": PERIOD_US,
                "processes": refs,
                "original": original,
            },
        )

    def _start_cycle(self, refs: list[list[float]]) -> None:
        spec = self.request
        with _CYCLERS_LOCK:
            if spec.id in _CYCLERS:
                return
            stop = _CYCLERS[spec.id] = threading.Event()
        deadline = time.monotonic() + spec.ttl_seconds
        on = PERIOD_US / 1e6 * spec.cpu_fraction
        off = PERIOD_US / 1e6 - on

        def cycle() -> None:
            try:
                while not stop.is_set() and time.monotonic() < deadline:
                    _signal_refs(refs, signal.SIGSTOP)
                    stop.wait(off)
                    _signal_refs(refs, signal.SIGCONT)
                    stop.wait(on)
            finally:
                _signal_refs(refs, signal.SIGCONT)

        threading.Thread(target=cycle, name=f"stormwatch-cpu-duty-{spec.id}", daemon=True).start()

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Move the processes back and remove the cgroup, or stop the duty cycle; each is
        checked (as :meth:`verify` does).

        Raises:
            FaultError: the cgroup is still there, or a process is still stopped.
        """
        spec = self.request
        with _CYCLERS_LOCK:
            stop = _CYCLERS.pop(spec.id, None)
        if stop is not None:
            stop.set()
        details: dict[str, Any] = dict(injection.details) if injection is not None else {}
        refs = details.get("processes", [])
        if details.get("method") == "duty_cycle" or stop is not None:
            _signal_refs(refs, signal.SIGCONT)
            _check_continued(refs)
            return
        root = _cgroup_root()
        if root is None:
            return
        folder = Path(details.get("cgroup") or root[1] / CGROUP_PARENT / short_tag(spec.id))
        if not folder.exists():
            return
        original: dict[str, str] = details.get("original", {})
        try:
            for pid in (folder / "cgroup.procs").read_text().split():
                back = root[1] / original.get(pid, "/").lstrip("/")
                target = back if (back / "cgroup.procs").exists() else root[1]
                with contextlib.suppress(ProcessLookupError):  # exited: nothing to move back
                    (target / "cgroup.procs").write_text(pid)
            wait_until(lambda: not (folder / "cgroup.procs").read_text().split(), 2.0)
            folder.rmdir()
        except OSError as exc:
            raise FaultError(f"cpu_throttle: cannot remove cgroup {folder}: {exc}") from exc
        _check_removed(folder)

    def verify(self, ctx: FaultContext, injection: Injection | None) -> None:
        """No recorded process is stopped (duty cycle), or the fault's cgroup is gone.

        Raises:
            FaultError: naming what is left.
        """
        details: dict[str, Any] = dict(injection.details) if injection is not None else {}
        if details.get("method") == "duty_cycle":
            _check_continued(details.get("processes", []))
        elif details.get("cgroup"):
            _check_removed(Path(details["cgroup"]))


def _check_continued(refs: list[list[float]]) -> None:
    still = wait_continued([p for ref in refs if (p := same_process(ref)) is not None])
    if still:
        raise FaultError(f"cpu_throttle: processes still stopped after SIGCONT: {still}")


def _check_removed(folder: Path) -> None:
    if folder.exists():
        raise FaultError(f"cpu_throttle: cgroup {folder} is still there")


def _signal_refs(refs: list[list[float]], number: signal.Signals) -> None:
    for ref in refs:
        if same_process(ref) is not None:
            with contextlib.suppress(ProcessLookupError):  # exited since: nothing to signal
                os.kill(int(ref[0]), number)


CPU_THROTTLE = FaultKind(
    kind="cpu_throttle",
    summary=(
        "Throttle one rank to ``cpu_fraction`` of one CPU (cgroup CPU quota, else a "
        "SIGSTOP/SIGCONT duty cycle): a noisy neighbour or a thermally limited host CPU."
    ),
    traits=Traits(
        target=Target.RANK,
        placement=Placement.ONE_NODE,
        detect_class=DetectClass.CPU_THROTTLE,
        job_scoped=True,
        needs_root=True,
    ),
    targeting=RankTarget,
    request=CpuThrottleRequest,
    fault=CpuThrottle,
)

__all__ = ["CPU_THROTTLE", "CpuThrottle", "CpuThrottleRequest"]
