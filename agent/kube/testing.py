"""A kubelet pod-resources server for tests: the real gRPC protocol on a unix socket.

:class:`KubeletServer` implements ``v1.PodResourcesLister/List`` with grpcio,
answering from :attr:`KubeletServer.pods` (set by the test), so that
:class:`~stormwatch.agent.kube.kubelet.KubeletPodResources` is exercised
over the same wire format and transport as against a kubelet.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent import futures
from typing import Any

import grpc

from stormwatch.agent.kube.kubelet import LIST_METHOD, messages


@dataclasses.dataclass
class FakePod:
    """One pod: ``containers`` maps a container name to ``[(resource_name, [device ids])]``."""

    namespace: str
    name: str
    containers: dict[str, list[tuple[str, list[str]]]]


class KubeletServer:
    """Serves ``List`` on ``socket`` until :meth:`stop`; ``available = False`` answers UNAVAILABLE."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.pods: list[FakePod] = []
        self.available = True
        self.calls = 0
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(
            self._list,
            request_deserializer=messages["ListPodResourcesRequest"].FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )
        service, method = LIST_METHOD.strip("/").split("/")
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {method: handler}),)
        )
        self._server.add_insecure_port(f"unix://{socket}")
        self._server.start()

    def _list(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            self.calls += 1
            if not self.available:
                context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
            response = messages["ListPodResourcesResponse"]()
            for pod in self.pods:
                item = response.pod_resources.add(name=pod.name, namespace=pod.namespace)
                for cname, devices in pod.containers.items():
                    container = item.containers.add(name=cname)
                    for resource, ids in devices:
                        container.devices.add(resource_name=resource, device_ids=ids)
            return response

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)


__all__ = ["FakePod", "KubeletServer"]
