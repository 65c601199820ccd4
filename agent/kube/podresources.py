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

The messages are built at import from a descriptor of the subset of
``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` that ``List`` needs
(field numbers as there; fields not declared here are skipped on parsing), so no
generated code or protoc is needed. :class:`PodResourcesLister` is the seam:
tests serve the real protocol from a gRPC server on a unix socket.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from stormwatch.agent.errors import PodResourcesError

log = logging.getLogger(__name__)

#: The kubelet's pod-resources socket (kubelet ``--pod-resources-socket``'s default path).
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: gRPC path of ``List``.
LIST_METHOD = "/v1.PodResourcesLister/List"
#: Resources whose device ids are GPUs (dcgm-exporter: ``nvidia.com/gpu`` and ``nvidia.com/mig-*``).
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def _messages() -> dict[str, type[Any]]:
    """Message classes of the ``List`` subset of the kubelet's v1 ``api.proto``."""
    T = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="stormwatch/kubelet/podresources/v1/api.proto", package="v1", syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name

    one, many = T.LABEL_OPTIONAL, T.LABEL_REPEATED
    message("ListPodResourcesRequest")
    message(
        "ListPodResourcesResponse", ("pod_resources", 1, T.TYPE_MESSAGE, many, ".v1.PodResources")
    )
    message(
        "PodResources",
        ("name", 1, T.TYPE_STRING, one, ""),
        ("namespace", 2, T.TYPE_STRING, one, ""),
        ("containers", 3, T.TYPE_MESSAGE, many, ".v1.ContainerResources"),
    )
    message(
        "ContainerResources",
        ("name", 1, T.TYPE_STRING, one, ""),
        ("devices", 2, T.TYPE_MESSAGE, many, ".v1.ContainerDevices"),
    )
    message(
        "ContainerDevices",
        ("resource_name", 1, T.TYPE_STRING, one, ""),
        ("device_ids", 2, T.TYPE_STRING, many, ""),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    names = (
        "ListPodResourcesRequest",
        "ListPodResourcesResponse",
        "PodResources",
        "ContainerResources",
        "ContainerDevices",
    )
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{n}")) for n in names
    }


#: The v1 messages by name (``messages["ListPodResourcesResponse"]()``...); a test server uses them too.
messages: Mapping[str, type[Any]] = _messages()


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


class KubeletPodResources:
    """:class:`PodResourcesLister` over the kubelet's unix socket (gRPC ``List``).

    Args:
        socket: path of the kubelet's pod-resources socket.
        timeout: seconds for one ``List`` (the kubelet answers from memory).
    """

    def __init__(self, socket: str = DEFAULT_SOCKET, *, timeout: float = 2.0) -> None:
        self.socket = socket
        self._timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._list = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=messages["ListPodResourcesResponse"].FromString,
        )

    def allocations(self) -> dict[str, PodRef]:
        try:
            response = self._list(messages["ListPodResourcesRequest"](), timeout=self._timeout)
        except grpc.RpcError as exc:
            raise PodResourcesError(f"pod-resources List on {self.socket}: {exc}") from exc
        return gpu_allocations(response.pod_resources)

    def close(self) -> None:
        self._channel.close()


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
    "LIST_METHOD",
    "MIG_RESOURCE_PREFIX",
    "KubeletPodResources",
    "PodAttribution",
    "PodRef",
    "PodResourcesError",
    "PodResourcesLister",
    "gpu_allocations",
    "messages",
]
