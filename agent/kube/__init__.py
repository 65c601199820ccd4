"""Kubernetes attribution: which pod holds which GPU, from the kubelet's pod-resources API.

:class:`KubeletPodResources` (the gRPC client, :mod:`.kubelet`) is imported on first
use, so that an agent off Kubernetes never loads gRPC and protobuf (~9 MiB resident).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stormwatch.agent.kube.podresources import (
    PodAttribution,
    PodRef,
    PodResourcesError,
    PodResourcesLister,
)

if TYPE_CHECKING:
    from stormwatch.agent.kube.kubelet import KubeletPodResources


def __getattr__(name: str) -> Any:
    if name == "KubeletPodResources":
        from stormwatch.agent.kube.kubelet import KubeletPodResources

        return KubeletPodResources
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "KubeletPodResources",
    "PodAttribution",
    "PodRef",
    "PodResourcesError",
    "PodResourcesLister",
]
