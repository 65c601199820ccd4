"""Simulated MIG: a GPU's MIG instances (:class:`SimMig`) and their NVML handles.

A :class:`~stormwatch.agent.gpu.sim.devices.SimGpu` in MIG mode holds its
instances by slot (``nvmlDeviceGetMigDeviceHandleByIndex``'s index; None: an
empty slot). Calls on a MIG device handle pass the call gate under the parent
GPU's index, so errors injected for that GPU hit its instances too. As with
NVML, whole-GPU readings (utilisation, temperature, power, clocks...) answer
NOT_SUPPORTED on a MIG handle (only its identity, attributes and memory answer),
and so does utilisation on the parent in MIG mode.
"""

from __future__ import annotations

import dataclasses
import uuid

import pynvml

#: MIG device slots of an H100 / A100 (``nvmlDeviceGetMaxMigDeviceCount``).
MAX_MIG_DEVICES = 7


@dataclasses.dataclass
class SimMig:
    """One MIG instance (a GPU instance with one compute instance filling it).

    Attributes:
        gpu_instance_id: ``nvmlDeviceGetGpuInstanceId``.
        uuid: ``MIG-<uuid>``.
        gi_slices, ci_slices: GPU / compute instance slices (``nvmlDeviceGetAttributes``).
        memory_mb: the instance's framebuffer, MiB (``memorySizeMB``).
        compute_instance_id: ``nvmlDeviceGetComputeInstanceId``.
        unsupported: NVML function names this instance answers NOT_SUPPORTED to
            (e.g. ``nvmlDeviceGetMemoryInfo``: its framebuffer series go absent).
    """

    gpu_instance_id: int
    uuid: str
    gi_slices: int = 1
    ci_slices: int = 1
    memory_mb: int = 9856
    compute_instance_id: int = 0
    unsupported: set[str] = dataclasses.field(default_factory=set)

    def attributes(self) -> pynvml.c_nvmlDeviceAttributes:
        """``nvmlDeviceGetAttributes``'s structure (an H100's 1g.10gb: 16 SMs)."""
        return pynvml.c_nvmlDeviceAttributes(
            multiprocessorCount=16 * self.gi_slices,
            sharedCopyEngineCount=self.gi_slices,
            gpuInstanceSliceCount=self.gi_slices,
            computeInstanceSliceCount=self.ci_slices,
            memorySizeMB=self.memory_mb,
        )


def make_mig(gpu: int, profiles: list[tuple[int, int]]) -> list[SimMig | None]:
    """MIG slots for GPU index ``gpu``: one instance per ``(slices, memory MiB)``, the rest empty.

    GPU instance ids follow NVML's placement on an H100 (7g: 0; otherwise 1, 2, ...
    in creation order); UUIDs are stable per (gpu, slot).

    Raises:
        ValueError: more profiles than :data:`MAX_MIG_DEVICES` slots.
    """
    if len(profiles) > MAX_MIG_DEVICES:
        raise ValueError(f"profiles: at most {MAX_MIG_DEVICES} MIG instances (got {len(profiles)})")
    slots: list[SimMig | None] = [None] * MAX_MIG_DEVICES
    for slot, (slices, memory_mb) in enumerate(profiles):
        slots[slot] = SimMig(
            gpu_instance_id=0 if slices == 7 else slot + 1,
            uuid=f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, f'stormwatch-sim-mig-{gpu}-{slot}')}",
            gi_slices=slices,
            ci_slices=slices,
            memory_mb=memory_mb,
        )
    return slots


@dataclasses.dataclass(frozen=True)
class FakeMigHandle:
    """Opaque MIG device handle: the parent GPU's index and the slot."""

    index: int
    slot: int


__all__ = ["MAX_MIG_DEVICES", "FakeMigHandle", "SimMig", "make_mig"]
