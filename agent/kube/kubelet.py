"""The kubelet's pod-resources gRPC client (``v1.PodResourcesLister/List``).

The messages are built at import from a descriptor of the subset of
``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` that ``List`` needs
(field numbers as there; fields not declared here are skipped on parsing), so no
generated code or protoc is needed. Kept apart from :mod:`.podresources` so that an
agent off Kubernetes never imports gRPC and protobuf (~9 MiB resident, measured with
``/proc/self/status`` ``VmRSS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from stormwatch.agent.errors import PodResourcesError
from stormwatch.agent.kube.podresources import DEFAULT_SOCKET, PodRef, gpu_allocations

#: gRPC path of ``List``.
LIST_METHOD = "/v1.PodResourcesLister/List"


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


__all__ = ["LIST_METHOD", "KubeletPodResources", "messages"]
