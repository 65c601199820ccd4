"""The simulated GPUs' sensor readings: deterministic functions of the time on a clock.

Utilisation swings between 5 % and 95 % with a 44 s period (phase-shifted by
the GPU index, so GPUs differ); memory use, temperature, power, the SM clock,
the throttle reasons, PCIe traffic and the video decoder follow it. Values are
plausible for an H100/H200 SXM in a training job (700 W board, 1980 MHz boost,
encoders idle) and use NVML's units (mW, mJ, MHz, KB/s, bytes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import pynvml

from stormwatch.agent.gpu.sim.devices import SimGpu

#: Framebuffer NVML reserves for itself (``c_nvmlMemory_v2_t.reserved``), bytes.
RESERVED_MEMORY = 512 * 1024 * 1024

#: ``nvmlDeviceGetPcieThroughput`` at zero utilisation, KB/s.
_PCIE_BASE = {pynvml.NVML_PCIE_UTIL_TX_BYTES: 200_000, pynvml.NVML_PCIE_UTIL_RX_BYTES: 250_000}


class Readings:
    """Sensor values of simulated GPUs at the clock's current time.

    Args:
        clock: seconds, monotonic; the readings' time is measured from the first reading of it.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._t0 = clock()

    def elapsed(self) -> float:
        """Seconds since this simulation started (never negative)."""
        return max(0.0, self._clock() - self._t0)

    def utilisation(self, gpu: SimGpu) -> int:
        """GPU utilisation, percent."""
        return int(50 + 45 * math.sin(self.elapsed() / 7.0 + gpu.index))

    def utilization_rates(self, gpu: SimGpu) -> pynvml.c_nvmlUtilization_t:
        """``nvmlDeviceGetUtilizationRates`` (memory busy half the time the SMs are)."""
        util = self.utilisation(gpu)
        return pynvml.c_nvmlUtilization_t(gpu=util, memory=util // 2)

    def memory_info(self, gpu: SimGpu, version: int | None, total: int | None = None) -> Any:
        """``nvmlDeviceGetMemoryInfo``: v1 structure, or v2 (with ``reserved``) when ``version``.

        ``total``: the framebuffer in bytes when not the whole GPU's (a MIG instance's).
        """
        total = gpu.memory_total if total is None else total
        share = 0.35 + 0.25 * math.sin(self.elapsed() / 11.0 + gpu.index)
        used = int(total * share)
        if version:
            return pynvml.c_nvmlMemory_v2_t(
                version=version,
                total=total,
                reserved=RESERVED_MEMORY,
                free=total - used - RESERVED_MEMORY,
                used=used,
            )
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def temperature(self, gpu: SimGpu) -> int:
        """GPU core temperature, degrees C (35 idle, 73 at full load)."""
        return 35 + self.utilisation(gpu) * 2 // 5

    def power_mw(self, gpu: SimGpu) -> int:
        """Power draw, milliwatts (90 W idle plus 5 W per percent of utilisation)."""
        return (90 + 5 * self.utilisation(gpu)) * 1000

    def energy_mj(self, gpu: SimGpu) -> int:
        """Millijoules since "boot" (the simulation's start), like NVML."""
        return int(self.elapsed() * 350_000) + gpu.index * 10**9

    def clock_mhz(self, gpu: SimGpu, clock_type: int) -> int:
        """``nvmlDeviceGetClockInfo``: capped by a clock lock (``nvmlDeviceSetGpuLockedClocks``).

        Raises:
            pynvml.NVMLError: ``NVML_ERROR_INVALID_ARGUMENT`` for an unknown clock type.
        """
        clocks = {
            pynvml.NVML_CLOCK_GRAPHICS: 1980,
            pynvml.NVML_CLOCK_SM: 1980 if self.utilisation(gpu) > 5 else 345,
            pynvml.NVML_CLOCK_MEM: 2619,
            pynvml.NVML_CLOCK_VIDEO: 1545,
        }
        if clock_type not in clocks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        locked = gpu.locked_clocks_mhz
        if locked is not None and clock_type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return min(clocks[clock_type], locked[1])
        return clocks[clock_type]

    def clock_events(self, gpu: SimGpu) -> int:
        """Throttle-reason bits: idle below 10 %, power-capped above 88 %, plus the forced ones
        (chaos ``gpu_throttle``)."""
        forced = gpu.forced_clock_events
        util = self.utilisation(gpu)
        if util < 10:
            return int(pynvml.nvmlClocksEventReasonGpuIdle) | forced
        if util > 88:
            return int(pynvml.nvmlClocksEventReasonSwPowerCap) | forced
        return int(pynvml.nvmlClocksEventReasonNone) | forced

    def pcie_kb_per_s(self, gpu: SimGpu, counter: int) -> int:
        """``nvmlDeviceGetPcieThroughput``: KB/s over NVML's 20 ms window.

        Raises:
            pynvml.NVMLError: ``NVML_ERROR_INVALID_ARGUMENT`` for an unknown counter.
        """
        if counter not in _PCIE_BASE:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _PCIE_BASE[counter] + 1000 * self.utilisation(gpu)

    def decoder_percent(self, gpu: SimGpu) -> int:
        """NVDEC utilisation, percent (nearly idle in a training job)."""
        return self.utilisation(gpu) // 20


__all__ = ["RESERVED_MEMORY", "Readings"]
