"""GPU access for the agent: NVML backends (real or simulated) and the background sampler.

- :mod:`.backend`: :class:`NvmlApi` protocol, :func:`open_backend` (auto / nvml / sim)
- :mod:`.fake`: :class:`FakeNvml`, the simulated NVML with error injection, the NVML
  face of the simulated GPUs in :mod:`.sim` (devices, call gate, readings, field
  values, events, GPM)
- :mod:`.sampler`: :class:`GpuSampler` producing immutable :class:`GpuSnapshot` s
- :mod:`.queries` (NVML function calls), :mod:`.fields` (NVML field values: ECC,
  retired pages, remapped rows, PCIe replays, memory temperature, violations),
  :mod:`.gpm` (``DCGM_FI_PROF_*`` from NVML GPM): the DCGM metric tables
- :mod:`.nvlink`, :mod:`.nvlink_errors`: per-link state, throughput and error counters
- :mod:`.identity` (labels and label fields), :mod:`.p2p` (NVLink P2P status)
- :mod:`.mig`: the MIG instances of a GPU in MIG mode (dcgm-exporter's per-instance series)
"""

from stormwatch.agent.gpu.backend import GpuBackend, NvmlApi, open_backend
from stormwatch.agent.gpu.fake import FakeNvml
from stormwatch.agent.gpu.model import (
    DeviceReading,
    GpuSnapshot,
    LinkReading,
    NvlinkReading,
    ProcessEntry,
)
from stormwatch.agent.gpu.sampler import GpuSampler, SamplerOptions
from stormwatch.agent.gpu.sim.devices import SimGpu, SimLink

__all__ = [
    "DeviceReading",
    "FakeNvml",
    "GpuBackend",
    "GpuSampler",
    "GpuSnapshot",
    "LinkReading",
    "NvlinkReading",
    "NvmlApi",
    "ProcessEntry",
    "SamplerOptions",
    "SimGpu",
    "SimLink",
    "open_backend",
]
