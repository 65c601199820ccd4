"""GPU faults on the simulated backend: the failures large runs see.

Simulated (``--gpu-backend sim``; the state of the agent's ``FakeNvml``, reached through
:class:`~stormwatch.faults.node.SimulatedGpus`, which the agent samples, so its exported
metrics show the fault):

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

The NVML power and clock cap (real GPUs too) is :mod:`.gpu_power`.

A restarted agent simulates fresh GPUs, so reverting a simulated fault from
the ledger alone has nothing left to undo.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Literal, TypeVar

import pynvml
from pydantic import Field

from stormwatch.faults.base import Fault, FaultRequest, Injection
from stormwatch.faults.errors import FaultError, FaultTargetNotFound
from stormwatch.faults.kind import DetectClass, FaultKind, Placement, Target, Traits
from stormwatch.faults.limits import GpuIndex, LinkIndex
from stormwatch.faults.node import FaultContext, SimulatedGpus
from stormwatch.faults.targeting import NodeOrRank

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
_FAULTY_GPU = "faulty_gpu"  # a GPU or its links failed


class _GpuRequest(FaultRequest):
    gpu: GpuIndex = 0


class GpuXidRequest(_GpuRequest):
    """``gpu_xid``: ``gpu``, ``xid``."""

    kind: Literal["gpu_xid"]
    xid: int = Field(ge=1, le=999)


class GpuThrottleRequest(_GpuRequest):
    """``gpu_throttle``: ``gpu``, ``reason`` (``thermal`` | ``power``)."""

    kind: Literal["gpu_throttle"]
    reason: Literal["thermal", "power"]


class NvlinkDownRequest(_GpuRequest):
    """``nvlink_down``: ``gpu``, ``links`` (None: all)."""

    kind: Literal["nvlink_down"]
    links: list[LinkIndex] | None = Field(default=None, min_length=1)


class NvlinkErrorsRequest(_GpuRequest):
    """``nvlink_errors``: ``gpu``, ``link``, ``counter``, ``count``."""

    kind: Literal["nvlink_errors"]
    link: LinkIndex = 0
    counter: Literal["crc_flit", "crc_data", "replay", "recovery"] = "crc_flit"
    count: int = Field(default=1000, ge=1, le=1 << 40)


class GpuLostRequest(_GpuRequest):
    """``gpu_lost``: ``gpu``."""

    kind: Literal["gpu_lost"]


_SimT = TypeVar("_SimT", bound=_GpuRequest)


class _SimFault(Fault[_SimT]):
    """Shared: find the simulated GPU (404 without a simulation or with too few GPUs)."""

    def _fake(self, ctx: FaultContext) -> SimulatedGpus:
        fake = ctx.simulated_gpus()
        index = self.request.gpu
        if fake is None:
            raise FaultTargetNotFound(
                f"{self.request.kind} needs the simulated GPU backend (node {ctx.node} has "
                f"{'none' if ctx.gpu() is None else 'real GPUs'})"
            )
        if not 0 <= index < len(fake.gpus):
            raise FaultTargetNotFound(
                f"gpu: node {ctx.node} has {len(fake.gpus)} GPU(s), no GPU {index}"
            )
        return fake

    def prepare(self, ctx: FaultContext) -> None:
        self._fake(ctx)


class GpuXid(_SimFault[GpuXidRequest]):
    """Emit the XID; DBE XIDs bump the DBE counters; XID 79 also loses the GPU."""

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.request
        fake = self._fake(ctx)
        gpu = fake.gpus[spec.gpu]
        fake.emit_xid(spec.gpu, spec.xid)
        details: dict[str, Any] = {"gpu": spec.gpu, "xid": spec.xid}
        if spec.xid in DBE_XIDS:
            gpu.counters["ecc_dbe_vol"] += 1
            gpu.counters["ecc_dbe_agg"] += 1
        if spec.xid == XID_FALLEN_OFF_BUS and not gpu.lost:
            self._lose_after_delivery(fake)
            details["lost"] = True
        return Injection(details=details)

    def _lose_after_delivery(self, fake: SimulatedGpus) -> None:
        """Lose the GPU once the agent has read the XID event (as on hardware, the driver
        reports XID 79 before the GPU is gone); at most :data:`XID_DELIVERY_TIMEOUT_S` later."""
        spec = self.request
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
            pending = _PENDING_LOSS.pop(self.request.id, None)
            if pending is not None:
                pending.set()
        _restore_lost(ctx, injection)


class GpuThrottle(_SimFault[GpuThrottleRequest]):
    """OR the reason's bits into the GPU's throttle reasons; revert clears the bits it added."""

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.request
        gpu = self._fake(ctx).gpus[spec.gpu]
        added = THROTTLE_BITS[spec.reason] & ~gpu.forced_clock_events
        gpu.forced_clock_events |= THROTTLE_BITS[spec.reason]
        return Injection(details={"gpu": spec.gpu, "bits": added})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        fake = ctx.simulated_gpus()
        if fake is None or injection is None:
            return
        fake.gpus[int(injection.details["gpu"])].forced_clock_events &= ~int(
            injection.details["bits"]
        )
        self.verify(ctx, injection)

    def verify(self, ctx: FaultContext, injection: Injection | None) -> None:
        """None of the bits this fault added is still set (nothing to check without a simulation).

        Raises:
            FaultError: some still are.
        """
        fake = ctx.simulated_gpus()
        if fake is None or injection is None:
            return
        left = fake.gpus[int(injection.details["gpu"])].forced_clock_events
        if left & int(injection.details["bits"]):
            raise FaultError(f"gpu_throttle: reason bits {left:#x} still set")


class NvlinkDown(_SimFault[NvlinkDownRequest]):
    """Deactivate links; revert reactivates the ones this fault deactivated."""

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.request
        links = self._fake(ctx).gpus[spec.gpu].links
        bad = [i for i in spec.links or [] if not 0 <= i < len(links)]
        if not links or bad:
            raise FaultTargetNotFound(
                f"links: GPU {spec.gpu} has {len(links)} NVLink link(s); no {bad}"
            )

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.request
        links = self._fake(ctx).gpus[spec.gpu].links
        chosen = spec.links if spec.links is not None else list(range(len(links)))
        downed = [i for i in chosen if links[i].active]
        for i in downed:
            links[i].active = False
        return Injection(details={"gpu": spec.gpu, "links": downed})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        fake = ctx.simulated_gpus()
        if fake is None or injection is None:
            return
        links = fake.gpus[int(injection.details["gpu"])].links
        for i in injection.details.get("links", []):
            links[int(i)].active = True
        self.verify(ctx, injection)

    def verify(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Every link this fault deactivated is active (nothing to check without a simulation).

        Raises:
            FaultError: naming the links still down.
        """
        fake = ctx.simulated_gpus()
        if fake is None or injection is None:
            return
        links = fake.gpus[int(injection.details["gpu"])].links
        down = [int(i) for i in injection.details.get("links", []) if not links[int(i)].active]
        if down:
            raise FaultError(f"nvlink_down: links {down} still inactive")


class NvlinkErrors(_SimFault[NvlinkErrorsRequest]):
    """Add ``count`` to one link's error counter (counters never go back: revert is a no-op)."""

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.request
        links = self._fake(ctx).gpus[spec.gpu].links
        if not 0 <= spec.link < len(links):
            raise FaultTargetNotFound(f"link: GPU {spec.gpu} has {len(links)} NVLink link(s)")

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.request
        link = self._fake(ctx).gpus[spec.gpu].links[spec.link]
        link.errors[spec.counter] = link.errors.get(spec.counter, 0) + spec.count
        return Injection(details={"gpu": spec.gpu, "link": spec.link, "counter": spec.counter})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Nothing to undo: error counters are cumulative."""
        return None


class GpuLost(_SimFault[GpuLostRequest]):
    """The GPU falls off the bus until revert."""

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.request
        fake = self._fake(ctx)
        was_lost = fake.gpus[spec.gpu].lost
        fake.lose_gpu(spec.gpu, True)
        return Injection(details={"gpu": spec.gpu, "lost": not was_lost})

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        _restore_lost(ctx, injection)


def _restore_lost(ctx: FaultContext, injection: Injection | None) -> None:
    """Bring back the GPU an injection lost (without a simulation there is nothing to undo)."""
    fake = ctx.simulated_gpus()
    if fake is not None and injection is not None and injection.details.get("lost"):
        fake.lose_gpu(int(injection.details["gpu"]), False)


def _simulated(kind: str, summary: str, request: type[_GpuRequest], fault: type[Fault[Any]],
               detect_class: DetectClass, category: str | None = None) -> FaultKind:  # fmt: skip
    """A simulated-GPU kind: a node fault, placed on one node's agent."""
    return FaultKind(
        kind=kind,
        summary=summary,
        traits=Traits(
            target=Target.NODE_OR_RANK,
            placement=Placement.ONE_NODE,
            category=category,
            detect_class=detect_class,
        ),
        targeting=NodeOrRank,
        request=request,
        fault=fault,
    )


GPU_XID = _simulated(
    "gpu_xid",
    "Simulated GPU: report XID ``xid`` on GPU ``gpu`` (79 fallen off the bus, 48 double-bit "
    "ECC, 94/95 contained/uncontained ECC; 48/94/95 also count a DBE; 79 also loses the GPU "
    "until the TTL).",
    GpuXidRequest,
    GpuXid,
    DetectClass.GPU_XID,  # XID 79 and the ECC XIDs alike
    # XID 79 (fell off the bus); XID 48/94/95 files set ``expect.category: gpu_hbm3_memory``
    category=_FAULTY_GPU,
)
GPU_THROTTLE = _simulated(
    "gpu_throttle",
    "Simulated GPU: clocks throttled for ``reason`` (``thermal``: HW + SW thermal slowdown "
    "bits; ``power``: SW power cap + HW power brake).",
    GpuThrottleRequest,
    GpuThrottle,
    DetectClass.GPU_THROTTLE,
)
NVLINK_DOWN = _simulated(
    "nvlink_down",
    "Simulated GPU: NVLink ``links`` (default all) of ``gpu`` inactive.",
    NvlinkDownRequest,
    NvlinkDown,
    DetectClass.NVLINK_DOWN,
    category=_FAULTY_GPU,
)
NVLINK_ERRORS = _simulated(
    "nvlink_errors",
    "Simulated GPU: a burst of ``count`` NVLink ``counter`` errors on ``link`` of ``gpu``.",
    NvlinkErrorsRequest,
    NvlinkErrors,
    DetectClass.NVLINK_ERRORS,
)
GPU_LOST = _simulated(
    "gpu_lost",
    "Simulated GPU: ``gpu`` falls off the bus (every NVML call: GPU_IS_LOST) until the TTL.",
    GpuLostRequest,
    GpuLost,
    DetectClass.GPU_LOST,
    category=_FAULTY_GPU,
)

__all__ = [
    "GPU_LOST",
    "GPU_THROTTLE",
    "GPU_XID",
    "NVLINK_DOWN",
    "NVLINK_ERRORS",
    "GpuLost",
    "GpuLostRequest",
    "GpuThrottle",
    "GpuThrottleRequest",
    "GpuXid",
    "GpuXidRequest",
    "NvlinkDown",
    "NvlinkDownRequest",
    "NvlinkErrors",
    "NvlinkErrorsRequest",
]
