"""Kubernetes attribution: which pod holds which GPU, from the kubelet's pod-resources API."""

from stormwatch.agent.kube.podresources import (
    KubeletPodResources,
    PodAttribution,
    PodRef,
    PodResourcesError,
    PodResourcesLister,
)

__all__ = [
    "KubeletPodResources",
    "PodAttribution",
    "PodRef",
    "PodResourcesError",
    "PodResourcesLister",
]
