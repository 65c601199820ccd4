"""``gpu_power_cap``: cap a GPU's power limit and/or lock its clocks through NVML.

Models a site power cap or a thermal policy: the power management limit goes to
``watts`` and/or graphics clocks are locked to at most ``max_clock_mhz``; the
previous limit is recorded and restored. Works on real GPUs (needs root and a GPU
that allows it; NVML's refusal, ``NO_PERMISSION`` or ``NOT_SUPPORTED``, is the
API's error) and on the simulation. Reverting from the ledger alone restores the
recorded cap (NVML is initialised for it when the agent has not opened it yet).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import pynvml
from pydantic import Field

from stormwatch.faults.base import Fault, FaultRequest, Injection, Problem
from stormwatch.faults.errors import FaultError, FaultTargetNotFound, InvalidFaultRequest
from stormwatch.faults.kind import DetectClass, FaultKind, Placement, Target, Traits
from stormwatch.faults.limits import GpuIndex
from stormwatch.faults.node import FaultContext
from stormwatch.faults.targeting import NodeOrRank

#: Lowest graphics clock of the lock range (an H100 idles at 210 MHz; NVML rejects 0).
MIN_CLOCK_MHZ = 210


def _something_capped(fault: Any) -> Problem | None:
    if fault.watts is None and fault.max_clock_mhz is None:
        return ("watts", "give 'watts', 'max_clock_mhz' or both")
    return None


class GpuPowerCapRequest(FaultRequest):
    """``gpu_power_cap``: ``gpu``, ``watts`` and/or ``max_clock_mhz``."""

    kind: Literal["gpu_power_cap"]
    gpu: GpuIndex = 0
    #: Checked against the GPU's own range when applied (``prepare``).
    watts: float | None = Field(default=None, gt=0, le=5000)
    #: At least :data:`MIN_CLOCK_MHZ`, the bottom of the lock range.
    max_clock_mhz: int | None = Field(default=None, ge=MIN_CLOCK_MHZ, le=10_000)

    checks = (_something_capped,)


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
        # The fault's own outcome is decided; a failed shutdown leaves nothing to undo.
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


class GpuPowerCap(Fault[GpuPowerCapRequest]):
    """Set the power limit / lock clocks through NVML; revert restores what was there."""

    def prepare(self, ctx: FaultContext) -> None:
        """Check the GPU exists and ``watts`` is within its settable range, without changing
        anything (NVML's own refusal of a value in range is the inject's error).

        Raises:
            FaultTargetNotFound: no GPU ``gpu`` on this node (404).
            InvalidFaultRequest: ``watts`` outside the GPU's power limit constraints (400).
            FaultError: NVML is not available.
        """
        spec = self.request
        with _nvml(ctx) as nvml:
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except pynvml.NVMLError as exc:
                raise FaultError(f"gpu_power_cap: NVML cannot count GPUs: {exc}") from exc
            if not 0 <= spec.gpu < count:
                raise FaultTargetNotFound(
                    f"gpu: node {ctx.node} has {count} GPU(s), no GPU {spec.gpu}"
                )
            if spec.watts is None:
                return
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(spec.gpu)
                low_mw, high_mw = nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            except pynvml.NVMLError:
                return  # no range to check against: the inject's NVML call decides
        if not low_mw <= spec.watts * 1000 <= high_mw:
            raise InvalidFaultRequest(
                [
                    (
                        "watts",
                        f"GPU {spec.gpu} accepts a power limit of {low_mw / 1000:g} to "
                        f"{high_mw / 1000:g} W (NVML's power management limit constraints); "
                        f"got {spec.watts:g}: give a value in that range",
                    )
                ]
            )

    def inject(self, ctx: FaultContext) -> Injection:
        spec = self.request
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
                    nvml.nvmlDeviceSetGpuLockedClocks(handle, MIN_CLOCK_MHZ, spec.max_clock_mhz)
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


GPU_POWER_CAP = FaultKind(
    kind="gpu_power_cap",
    summary=(
        "NVML (real or simulated): cap ``gpu``'s power limit to ``watts`` (and/or lock clocks "
        "to at most ``max_clock_mhz``); the previous values are restored at the TTL."
    ),
    traits=Traits(
        target=Target.NODE_OR_RANK,
        placement=Placement.ONE_NODE,
        detect_class=DetectClass.GPU_THROTTLE,  # a capped GPU is a throttled one
        needs_root=True,
    ),
    targeting=NodeOrRank,
    request=GpuPowerCapRequest,
    fault=GpuPowerCap,
)

__all__ = ["GPU_POWER_CAP", "MIN_CLOCK_MHZ", "GpuPowerCap", "GpuPowerCapRequest"]
