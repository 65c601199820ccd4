"""GPU faults: on the simulated backend, the failures large runs see; on NVML, power and clock caps.

Simulated (``--gpu-backend sim``; the state of :class:`~stormwatch.agent.gpu.fake.FakeNvml`
the agent samples, so its exported metrics show the fault):

* ``gpu_xid``: an XID event on a GPU. 79 "GPU has fallen off the bus" (the GPU
  is also lost until the TTL), 48 "double-bit ECC error", 94 "contained ECC
  error", 95 "uncontained ECC error" (48/94/95 also count one volatile and one
  aggregate DBE, which stay: error counters never go back). Seen as
  ``DCGM_FI_DEV_XID_ERRORS`` and ``DCGM_EXP_XID_ERRORS_COUNT{xid}``.
* ``gpu_throttle``: clocks throttled for ``thermal`` (HW + SW thermal slowdown
  bits) or ``power`` (SW power cap + HW power brake) reasons, e.g. a failed fan
  or a PSU fault: ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` and
  ``stormwatch_gpu_clocks_event_active{reason}``.
* ``nvlink_down``: NVLink links inactive (a bad cable or NVSwitch port).
* ``nvlink_errors``: a burst of CRC/replay/recovery errors on one link (a
  marginal link); counters stay.
* ``gpu_lost``: the GPU falls off the bus (every NVML call: GPU_IS_LOST).

NVML (real driver, or the simulation): ``gpu_power_cap`` sets the power
management limit to ``watts`` and/or locks graphics clocks to at most
``max_clock_mhz`` (a site power cap, a thermal policy); the previous limit is
recorded and restored. Needs root and a GPU that allows it; NVML's refusal
(``NO_PERMISSION``, ``NOT_SUPPORTED``) is the API's error.

A restarted agent simulates fresh GPUs, so reverting a simulated fault from
the ledger alone has nothing left to undo; real NVML caps are restored from the
ledger (NVML is initialised for it when the agent has not opened it yet).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import pynvml
from pydantic import Field

from stormwatch.agent.errors import FaultError, FaultTargetNotFound
from stormwatch.agent.faults.base import Fault, FaultContext, FaultSpec, Injection
from stormwatch.agent.gpu.fake import FakeNvml

#: XIDs that report an uncorrectable (double-bit) ECC error.
DBE_XIDS = frozenset({48, 94, 95})
#: XID 79: the GPU has fallen off the bus.
XID_FALLEN_OFF_BUS = 79
#: Longest wait for the agent to read an XID 79 event before the GPU is lost, seconds
#: (the agent reads events once per sample: 1 s by default).
XID_DELIVERY_TIMEOUT_S = 5.0
#: XID 79 losses not yet applied, by fault id (revert cancels them).
_PENDING_LOSS: dict[str, threading.Event] = {}
_PENDING_LOCK = threading.Lock()
THROTTLE_BITS = {
    "thermal": int(pynvml.nvmlClocksEventReasonHwThermalSlowdown)
    | int(pynvml.nvmlClocksEventReasonSwThermalSlowdown),
    "power": int(pynvml.nvmlClocksEventReasonSwPowerCap)
    | int(pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown),
}
#: Lowest graphics clock of the lock range (an H100 idles at 210 MHz; NVML rejects 0).
MIN_CLOCK_MHZ = 210
_GPU = Field(default=0, ge=0, le=63)


class GpuXidSpec(FaultSpec):
    """``gpu_xid``: ``gpu``, ``xid``."""

    kind: Literal["gpu_xid"]
    gpu: int = _GPU
    xid: int = Field(ge=1, le=999)


class GpuThrottleSpec(FaultSpec):
    """``gpu_throttle``: ``gpu``, ``reason`` (``thermal`` | ``power``)."""

    kind: Literal["gpu_throttle"]
    gpu: int = _GPU
    reason: Literal["thermal", "power"]


class NvlinkDownSpec(FaultSpec):
    """``nvlink_down``: ``gpu``, ``links`` (None: all)."""

    kind: Literal["nvlink_down"]
    gpu: int = _GPU
    links: list[int] | None = Field(default=None, min_length=1)


class NvlinkErrorsSpec(FaultSpec):
    """``nvlink_errors``: ``gpu``, ``link``, ``counter``, ``count``."""

    kind: Literal["nvlink_errors"]
    gpu: int = _GPU
    link: int = Field(default=0, ge=0, le=63)
    counter: Literal["crc_flit", "crc_data", "replay", "recovery"] = "crc_flit"
    count: int = Field(default=1000, ge=1, le=1 << 40)


class GpuLostSpec(FaultSpec):
    """``gpu_lost``: ``gpu``."""

    kind: Literal["gpu_lost"]
    gpu: int = _GPU


class GpuPowerCapSpec(FaultSpec):
    """``gpu_power_cap``: ``gpu``, ``watts`` and/or ``max_clock_mhz``."""

    kind: Literal["gpu_power_cap"]
    gpu: int = _GPU
    watts: float | None = Field(default=None, gt=0, le=5000)
    max_clock_mhz: int | None = Field(default=None, gt=0, le=10_000)


class _SimFault(Fault):
    """Shared: find the simulated GPU (404 without a simulation or with too few GPUs)."""

    def _fake(self, ctx: FaultContext) -> FakeNvml:
        api = ctx.gpu()
        index = int(getattr(self.spec, "gpu", 0))
        if not isinstance(api, FakeNvml):
            raise FaultTargetNotFound(
                f"{self.kind} needs the simulated GPU backend (node {ctx.node} has "
                f"{'none' if api is None else 'real GPUs'})"
            )
        if not 0 <= index < len(api.gpus):
            raise FaultTargetNotFound(
                f"gpu: node {ctx.node} has {len(api.gpus)} GPU(s), no GPU {index}"
            )
        return api

    def prepare(self, ctx: FaultContext) -> None:
        self._fake(ctx)

    def _fake_or_none(self, ctx: FaultContext) -> FakeNvml | None:
        api = ctx.gpu()
        return api if isinstance(api, FakeNvml) else None


class GpuXid(_SimFault):
    """Emit the XID; DBE XIDs bump the DBE counters; XID 79 also loses the GPU."""

    kind = "gpu_xid"
    spec_type = GpuXidSpec

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.spec
        assert isinstance(spec, GpuXidSpec)
        fake = self._fake(ctx)
        gpu = fake.gpus[spec.gpu]
        fake.emit_xid(spec.gpu, spec.xid)
        details: dict[str, Any] = {"gpu": spec.gpu, "xid": spec.xid}
        if spec.xid in DBE_XIDS:
            gpu.counters["ecc_dbe_vol"] += 1
            gpu.counters["ecc_dbe_agg"] += 1
        if spec.xid == XID_FALLEN_OFF_BUS and not gpu.lost:
            self._lose_after_delivery(fake, spec)
            details["lost"] = True
        return Injection(details=details)

    def _lose_after_delivery(self, fake: FakeNvml, spec: GpuXidSpec) -> None:
        """Lose the GPU once the agent has read the XID event (as on hardware, the driver
        reports XID 79 before the GPU is gone); at most :data:`XID_DELIVERY_TIMEOUT_S` later."""
        cancelled = threading.Event()
        with _PENDING_LOCK:
            _PENDING_LOSS[spec.id] = cancelled

        def lose() -> None:
            deadline = time.monotonic() + XID_DELIVERY_TIMEOUT_S
            while fake.pending_events() and time.monotonic() < deadline:
                if cancelled.wait(0.02):
                    return
            with _PENDING_LOCK:
                if not cancelled.is_set():
                    fake.lose_gpu(spec.gpu, True)
                _PENDING_LOSS.pop(spec.id, None)

        threading.Thread(target=lose, name=f"stormwatch-xid79-{spec.id}", daemon=True).start()

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Bring back a GPU this fault lost; XIDs and error counts are history and stay."""
        with _PENDING_LOCK:
            pending = _PENDING_LOSS.pop(self.spec.id, None)
            if pending is not None:
                pending.set()
        fake = self._fake_or_none(ctx)
        if fake is not None and injection is not None and injection.details.get("lost"):
            fake.lose_gpu(int(injection.details["gpu"]), False)


class GpuThrottle(_SimFault):
    """OR the reason's bits into the GPU's throttle reasons; revert clears the bits it added."""

    kind = "gpu_throttle"
    spec_type = GpuThrottleSpec

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.spec
        assert isinstance(spec, GpuThrottleSpec)
        gpu = self._fake(ctx).gpus[spec.gpu]
        added = THROTTLE_BITS[spec.reason] & ~gpu.forced_clock_events
        gpu.forced_clock_events |= THROTTLE_BITS[spec.reason]
        return Injection(details={"gpu": spec.gpu, "bits": added})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        fake = self._fake_or_none(ctx)
        if fake is None or injection is None:
            return
        fake.gpus[int(injection.details["gpu"])].forced_clock_events &= ~int(
            injection.details["bits"]
        )


class NvlinkDown(_SimFault):
    """Deactivate links; revert reactivates the ones this fault deactivated."""

    kind = "nvlink_down"
    spec_type = NvlinkDownSpec

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.spec
        assert isinstance(spec, NvlinkDownSpec)
        links = self._fake(ctx).gpus[spec.gpu].links
        bad = [i for i in spec.links or [] if not 0 <= i < len(links)]
        if not links or bad:
            raise FaultTargetNotFound(
                f"links: GPU {spec.gpu} has {len(links)} NVLink link(s); no {bad}"
            )

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.spec
        assert isinstance(spec, NvlinkDownSpec)
        links = self._fake(ctx).gpus[spec.gpu].links
        chosen = spec.links if spec.links is not None else list(range(len(links)))
        downed = [i for i in chosen if links[i].active]
        for i in downed:
            links[i].active = False
        return Injection(details={"gpu": spec.gpu, "links": downed})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        fake = self._fake_or_none(ctx)
        if fake is None or injection is None:
            return
        links = fake.gpus[int(injection.details["gpu"])].links
        for i in injection.details.get("links", []):
            links[int(i)].active = True


class NvlinkErrors(_SimFault):
    """Add ``count`` to one link's error counter (counters never go back: revert is a no-op)."""

    kind = "nvlink_errors"
    spec_type = NvlinkErrorsSpec

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.spec
        assert isinstance(spec, NvlinkErrorsSpec)
        links = self._fake(ctx).gpus[spec.gpu].links
        if not 0 <= spec.link < len(links):
            raise FaultTargetNotFound(f"link: GPU {spec.gpu} has {len(links)} NVLink link(s)")

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.spec
        assert isinstance(spec, NvlinkErrorsSpec)
        link = self._fake(ctx).gpus[spec.gpu].links[spec.link]
        link.errors[spec.counter] = link.errors.get(spec.counter, 0) + spec.count
        return Injection(details={"gpu": spec.gpu, "link": spec.link, "counter": spec.counter})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Nothing to undo: error counters are cumulative."""
        return None


class GpuLost(_SimFault):
    """The GPU falls off the bus until revert."""

    kind = "gpu_lost"
    spec_type = GpuLostSpec

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.spec
        assert isinstance(spec, GpuLostSpec)
        fake = self._fake(ctx)
        was_lost = fake.gpus[spec.gpu].lost
        fake.lose_gpu(spec.gpu, True)
        return Injection(details={"gpu": spec.gpu, "lost": not was_lost})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        fake = self._fake_or_none(ctx)
        if fake is not None and injection is not None and injection.details.get("lost"):
            fake.lose_gpu(int(injection.details["gpu"]), False)


@contextlib.contextmanager
def _nvml(ctx: FaultContext) -> Iterator[Any]:
    """The agent's NVML backend, or ``pynvml`` initialised for the block (agent start-up)."""
    api = ctx.gpu()
    if api is not None:
        yield api
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise FaultError(f"NVML is not available on node {ctx.node}: {exc}") from exc
    try:
        yield pynvml
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


class GpuPowerCap(Fault):
    """Set the power limit / lock clocks through NVML; revert restores what was there."""

    kind = "gpu_power_cap"
    spec_type = GpuPowerCapSpec

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.spec
        assert isinstance(spec, GpuPowerCapSpec)
        if spec.watts is None and spec.max_clock_mhz is None:
            raise FaultError("give 'watts', 'max_clock_mhz' or both")

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.spec
        assert isinstance(spec, GpuPowerCapSpec)
        details: dict[str, Any] = {"gpu": spec.gpu}
        with _nvml(ctx) as nvml:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(spec.gpu)
                if spec.watts is not None:
                    details["previous_power_limit_mw"] = int(
                        nvml.nvmlDeviceGetPowerManagementLimit(handle)
                    )
                    nvml.nvmlDeviceSetPowerManagementLimit(handle, int(spec.watts * 1000))
                if spec.max_clock_mhz is not None:
                    nvml.nvmlDeviceSetGpuLockedClocks(
                        handle, min(MIN_CLOCK_MHZ, spec.max_clock_mhz), spec.max_clock_mhz
                    )
                    details["clocks_locked"] = True
            except pynvml.NVMLError as exc:
                self._restore(nvml, details)  # nothing half-applied
                raise FaultError(f"gpu_power_cap on GPU {spec.gpu}: NVML refused: {exc}") from exc
        return Injection(details=details)

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Restore the recorded power limit and reset clock locks.

        Raises:
            FaultError: NVML refused.
        """
        if injection is None:
            return
        with _nvml(ctx) as nvml:
            try:
                self._restore(nvml, dict(injection.details))
            except pynvml.NVMLError as exc:
                raise FaultError(f"gpu_power_cap revert: NVML refused: {exc}") from exc

    @staticmethod
    def _restore(nvml: Any, details: dict[str, Any]) -> None:
        handle = nvml.nvmlDeviceGetHandleByIndex(int(details["gpu"]))
        if "previous_power_limit_mw" in details:
            nvml.nvmlDeviceSetPowerManagementLimit(handle, int(details["previous_power_limit_mw"]))
        if details.get("clocks_locked"):
            nvml.nvmlDeviceResetGpuLockedClocks(handle)


__all__ = [
    "GpuLost",
    "GpuLostSpec",
    "GpuPowerCap",
    "GpuPowerCapSpec",
    "GpuThrottle",
    "GpuThrottleSpec",
    "GpuXid",
    "GpuXidSpec",
    "NvlinkDown",
    "NvlinkDownSpec",
    "NvlinkErrors",
    "NvlinkErrorsSpec",
]
