"""Slowdown faults: CPU throttling of ranks, and the trainer's own fault points.

* ``cpu_throttle``: a rank (with its descendants) gets ``cpu_fraction`` of one
  CPU: a noisy neighbour, a throttled host CPU, a misconfigured CPU quota in
  a container. The rank becomes a compute straggler (FC-14), the others wait
  for it. Mechanism (``method: auto`` picks the first available):
  cgroup v2 (a dedicated cgroup ``stormwatch-faults/<tag>`` with ``cpu.max``),
  cgroup v1 (``cpu.cfs_quota_us``), else a SIGSTOP/SIGCONT duty cycle (100 ms
  period, a thread of the agent, ended at the TTL). The original cgroup of each
  process is recorded; revert moves them back, removes the cgroup and checks
  it is gone.
* ``trainer_fault``: arms a fault point of the trainer through its control
  channel ``<control-dir>/rank<R>.json`` (``trainer/control.py``): ``slow_step``
  (extra compute before backward: a slow GPU or a dataloader stall),
  ``collective_delay`` (a slow link on one rank), ``collective_hang`` (a rank
  that never joins a collective: FC-10), ``error_at_step`` (a crash raised by
  the training code). The entry carries ``expires_at`` (the TTL), so the
  trainer disarms it by itself; revert removes exactly this entry and leaves
  other entries (another fault, a responder's ``checkpoint_now``) alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import Field

from stormwatch.agent.errors import FaultError, FaultTargetNotFound
from stormwatch.agent.faults._system import (
    job_ranks,
    process_ref,
    rank_option,
    same_process,
    short_tag,
    wait_until,
)
from stormwatch.agent.faults.base import Fault, FaultContext, FaultSpec, Injection

#: cgroup v2 / v1 mount points tried, and the folder holding the faults' cgroups.
CGROUP2_ROOT = Path("/sys/fs/cgroup")
CGROUP2_UNIFIED = Path("/sys/fs/cgroup/unified")
CGROUP1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_PARENT = "stormwatch-faults"
#: Scheduling period of the quota and of the duty cycle, microseconds (the kernel's default).
PERIOD_US = 100_000


class CpuThrottleSpec(FaultSpec):
    """``cpu_throttle``: ``rank``, ``job``, ``cpu_fraction`` (of one CPU), ``method``."""

    kind: Literal["cpu_throttle"]
    rank: int = Field(ge=0)
    job: str | None = Field(default=None, min_length=1)
    cpu_fraction: float = Field(gt=0, lt=64)
    method: Literal["auto", "cgroup", "duty_cycle"] = "auto"


class TrainerFaultSpec(FaultSpec):
    """``trainer_fault``: ``rank``, ``job``, ``point`` and its fields (see the module doc)."""

    kind: Literal["trainer_fault"]
    rank: int = Field(ge=0)
    job: str | None = Field(default=None, min_length=1)
    point: Literal["slow_step", "collective_delay", "collective_hang", "error_at_step"]
    seconds: float | None = Field(default=None, gt=0, le=3600)
    op: str | None = Field(default=None, min_length=1)
    mesh_dim: str | None = Field(default=None, min_length=1)
    step: int | None = Field(default=None, ge=1)


def _rank_processes(ctx: FaultContext, rank: int, job: str | None) -> list[psutil.Process]:
    ranks = [r for r in job_ranks(ctx, job) if r.rank == rank]
    if not ranks:
        raise FaultTargetNotFound(f"rank {rank} is not running on node {ctx.node}")
    if len(ranks) > 1:
        raise FaultError(f"rank {rank} runs in several jobs on node {ctx.node}; give 'job'")
    process = psutil.Process(ranks[0].pid)
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


class CpuThrottle(Fault):
    """cgroup CPU quota, or a SIGSTOP/SIGCONT duty cycle."""

    kind = "cpu_throttle"
    spec_type = CpuThrottleSpec

    def __init__(self, spec: FaultSpec) -> None:
        super().__init__(spec)
        self._targets: list[psutil.Process] = []

    @property
    def _spec(self) -> CpuThrottleSpec:
        assert isinstance(self.spec, CpuThrottleSpec)
        return self.spec

    def prepare(self, ctx: FaultContext) -> None:
        spec = self._spec
        self._targets = _rank_processes(ctx, spec.rank, spec.job)
        if spec.method == "cgroup" and _cgroup_root() is None:
            raise FaultError("method: no cgroup CPU controller on this node; use duty_cycle")
        if spec.method != "cgroup" and _cgroup_root() is None and spec.cpu_fraction >= 1:
            raise FaultError("cpu_fraction must be below 1 for a duty cycle")

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self._spec
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
                with contextlib.suppress(ProcessLookupError):
                    (folder / "cgroup.procs").write_text(str(int(ref[0])))
        except OSError as exc:
            partial = {"method": f"cgroup-{version}", "cgroup": str(folder), "original": original}
            with contextlib.suppress(FaultError):  # nothing half-applied
                self.revert(ctx, Injection(details={**partial, "processes": refs}))
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
        spec = self._spec
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
        """Move the processes back and remove the cgroup, or stop the duty cycle.

        Raises:
            FaultError: the cgroup is still there, or a process is still stopped.
        """
        spec = self._spec
        with _CYCLERS_LOCK:
            stop = _CYCLERS.pop(spec.id, None)
        if stop is not None:
            stop.set()
        details: dict[str, Any] = dict(injection.details) if injection is not None else {}
        refs = details.get("processes", [])
        if details.get("method") == "duty_cycle" or stop is not None:
            _signal_refs(refs, signal.SIGCONT)
            alive = [p for ref in refs if (p := same_process(ref)) is not None]
            if not wait_until(lambda: not any(_stopped(p) for p in alive), 2.0):
                raise FaultError("cpu_throttle: a process is still stopped after SIGCONT")
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
                with contextlib.suppress(ProcessLookupError):
                    (target / "cgroup.procs").write_text(pid)
            wait_until(lambda: not (folder / "cgroup.procs").read_text().split(), 2.0)
            folder.rmdir()
        except OSError as exc:
            raise FaultError(f"cpu_throttle: cannot remove cgroup {folder}: {exc}") from exc
        if folder.exists():
            raise FaultError(f"cpu_throttle: cgroup {folder} is still there")


def _stopped(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def _signal_refs(refs: list[list[float]], number: signal.Signals) -> None:
    for ref in refs:
        if same_process(ref) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(ref[0]), number)


class TrainerFault(Fault):
    """Add one entry to the rank's control file; revert removes exactly that entry."""

    kind = "trainer_fault"
    spec_type = TrainerFaultSpec

    def __init__(self, spec: FaultSpec) -> None:
        super().__init__(spec)
        self._path: Path | None = None

    @property
    def _spec(self) -> TrainerFaultSpec:
        assert isinstance(self.spec, TrainerFaultSpec)
        return self.spec

    def prepare(self, ctx: FaultContext) -> None:
        spec = self._spec
        needs_seconds = spec.point in ("slow_step", "collective_delay")
        if needs_seconds != (spec.seconds is not None):
            raise FaultError(
                f"seconds: {'required' if needs_seconds else 'not used'} for {spec.point}"
            )
        if (spec.point == "error_at_step") != (spec.step is not None):
            raise FaultError("step: required for error_at_step and only for it")
        rank_process = _rank_processes(ctx, spec.rank, spec.job)[0]
        control = rank_option(ctx, spec.job, "--control-dir")
        if control is None:  # the trainer's own precedence: option, environment, default
            with contextlib.suppress(psutil.Error):
                env = rank_process.environ().get("STORMWATCH_CONTROL_DIR")
                control = Path(rank_process.cwd(), env).resolve() if env else None
        if control is None:
            metrics = rank_option(ctx, spec.job, "--metrics-dir") or ctx.metrics_dir
            if metrics is None:
                raise FaultError(f"cannot tell rank {spec.rank}'s control folder on {ctx.node}")
            control = Path(metrics) / "control"
        self._path = control / f"rank{spec.rank}.json"

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self._spec
        assert self._path is not None
        entry: dict[str, Any] = {
            "point": spec.point,
            "expires_at": round(time.time() + spec.ttl_seconds, 3),
        }
        for name in ("seconds", "op", "mesh_dim", "step"):
            value = getattr(spec, name)
            if value is not None:
                entry[name] = value
        entries = _read_entries(self._path)
        if entry not in entries:
            _write_entries(self._path, [*entries, entry])
        return Injection(details={"path": str(self._path), "entry": entry})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Remove this fault's entry (other entries stay); verify it is gone.

        Raises:
            FaultError: the file cannot be rewritten.
        """
        if injection is None:
            return
        path, entry = Path(injection.details["path"]), injection.details["entry"]
        entries = _read_entries(path)
        if entry in entries:
            _write_entries(path, [e for e in entries if e != entry])
        if entry in _read_entries(path):
            raise FaultError(f"trainer_fault entry still in {path}")


def _read_entries(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return []  # an unreadable file arms nothing in the trainer either; ours replaces it
    faults = data.get("faults") if isinstance(data, dict) else None
    return [f for f in faults if isinstance(f, dict)] if isinstance(faults, list) else []


def _write_entries(path: Path, entries: list[dict[str, Any]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not entries:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"faults": entries}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise FaultError(f"trainer_fault: cannot write {path}: {exc}") from exc


__all__ = ["CpuThrottle", "CpuThrottleSpec", "TrainerFault", "TrainerFaultSpec"]
