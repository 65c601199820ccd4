"""Which pod holds which GPU: the kubelet's pod-resources API (gRPC ``v1.PodResourcesLister``).

The kubelet serves ``List`` on a unix socket (default
``/var/lib/kubelet/pod-resources/kubelet.sock``): per pod and container, the
device ids each device plugin allocated. For ``nvidia.com/gpu`` these are GPU
UUIDs (``GPU-...``) or, with the device plugin's ``DEVICE_ID_STRATEGY=index``
and on GKE, device names (``nvidia0``); MIG resources (``nvidia.com/mig-*``)
list MIG device UUIDs (``MIG-...``) or GKE's ``nvidia0/gi1``. dcgm-exporter's
pod mapper matches the same ids (its ``transformation/kubernetes.go``) and adds
``namespace``, ``pod`` and ``container`` to the GPU's series; so does
:class:`PodAttribution`.

The gRPC client is :mod:`.kubelet` (imported only on Kubernetes, when the agent is
given a pod-resources socket: gRPC and protobuf are ~9 MiB of the agent's memory).
:class:`PodResourcesLister` is the seam: tests serve the real protocol from a gRPC
server on a unix socket.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from stormwatch.agent.errors import PodResourcesError

log = logging.getLogger(__name__)

#: The kubelet's pod-resources socket (kubelet ``--pod-resources-socket``'s default path).
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: Resources whose device ids are GPUs (dcgm-exporter: ``nvidia.com/gpu`` and ``nvidia.com/mig-*``).
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


@dataclasses.dataclass(frozen=True)
class PodRef:
    """The container a device is allocated to (dcgm-exporter's ``namespace``/``pod``/``container``)."""

    namespace: str
    pod: str
    container: str

    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}


class PodResourcesLister(Protocol):
    """Lists the kubelet's device allocations: device id -> the container holding it.

    Raises:
        PodResourcesError: the kubelet did not answer.
    """

    def allocations(self) -> dict[str, PodRef]: ...


def gpu_allocations(pods: Iterable[Any]) -> dict[str, PodRef]:
    """Device id -> container, for NVIDIA GPU and MIG resources of ``PodResources`` messages."""
    out: dict[str, PodRef] = {}
    for pod in pods:
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                name = devices.resource_name
                if name != GPU_RESOURCE and not name.startswith(MIG_RESOURCE_PREFIX):
                    continue
                for device_id in devices.device_ids:
                    out[str(device_id)] = ref
    return out


class PodAttribution:
    """The latest allocations, re-listed at most every ``max_age`` seconds (the gpu,
    nvlink and xid collectors all ask during one render).

    Args:
        lister: the kubelet (or a test's double).
        max_age: seconds an answer is reused.
        monotonic: clock of ``max_age``.
    """

    def __init__(
        self,
        lister: PodResourcesLister,
        *,
        max_age: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lister = lister
        self._max_age = max_age
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._allocations: dict[str, PodRef] = {}
        self.up = False
        self.error: str | None = None

    def refresh(self) -> None:
        """Re-list when the last answer is older than ``max_age``; a failure leaves
        nothing attributed (``up`` False) rather than stale pods."""
        with self._lock:
            now = self._monotonic()
            if now - self._at < self._max_age:
                return
            self._at = now
            try:
                self._allocations = self._lister.allocations()
            except PodResourcesError as exc:
                if self.up or self.error is None:
                    log.warning("GPU pod attribution unavailable: %s", exc)
                self._allocations, self.up, self.error = {}, False, str(exc)
            else:
                self.up, self.error = True, None

    def lookup(self, ids: Iterable[str]) -> PodRef | None:
        """The container holding the device known by any of ``ids`` (UUID, device name)."""
        allocations = self._allocations
        return next((allocations[i] for i in ids if i in allocations), None)

    def device_ids(self) -> frozenset[str]:
        """Every allocated GPU device id of the last answer."""
        return frozenset(self._allocations)


__all__ = [
    "DEFAULT_SOCKET",
    "GPU_RESOURCE",
    "MIG_RESOURCE_PREFIX",
    "PodAttribution",
    "PodRef",
    "PodResourcesError",
    "PodResourcesLister",
    "gpu_allocations",
]
