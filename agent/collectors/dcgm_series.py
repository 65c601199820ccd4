"""The series of one GPU under dcgm-exporter's labels: MIG instances and pod attribution.

dcgm-exporter (default ``--devices f``) exports a GPU in MIG mode per GPU
instance, never as a whole: each instance's series carry ``GPU_I_PROFILE`` and
``GPU_I_ID`` next to the parent's ``gpu``/``UUID``/``device`` labels. On
Kubernetes its pod mapper adds ``namespace``, ``pod`` and ``container`` to the
series of a GPU (or MIG instance) that a container holds, and nothing to the
others. :class:`DcgmSeries` gives the gpu, nvlink and xid collectors those
series, so every DCGM family carries the same label set for the same device.
"""

from __future__ import annotations

import dataclasses

from stormwatch.agent.gpu.model import DCGM_LABELS, DeviceReading, MigReading
from stormwatch.agent.kube.podresources import PodAttribution, PodRef

#: Framebuffer metrics read per MIG instance (its own memory).
MIG_SCOPED: frozenset[str] = frozenset(
    {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"}
)
#: Metrics a MIG instance does not report: DCGM answers blank for the whole-GPU
#: utilisations on a GPU instance, and the agent does not sample GPM per instance.
MIG_ABSENT_PREFIXES: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_PROF_",
)

#: Label dicts a :class:`DcgmSeries` keeps (one per GPU or MIG instance and pod): far more
#: than a node has, few enough to stay small when pods come and go.
_LABEL_DICTS_KEPT = 1024


@dataclasses.dataclass(frozen=True)
class Series:
    """One dcgm-exporter series target: a whole GPU, or one of its MIG instances.

    Attributes:
        labels: values of :data:`~stormwatch.agent.gpu.model.DCGM_LABELS`.
        extra: MIG and pod labels present on this series only.
        mig: the instance, None for a whole GPU.
        pod: the container holding it, None when none does (or unknown).
    """

    labels: list[str]
    extra: dict[str, str]
    mig: MigReading | None
    pod: PodRef | None
    #: Every label of the series (the six, then ``extra``): one dict shared by the
    #: series' samples in every family, and from one collect to the next while the labels
    #: stay the same (so comparing samples with the last render's stops at the dict's
    #: identity).
    label_dict: dict[str, str] = dataclasses.field(default_factory=dict, compare=False)

    def value(self, device: DeviceReading, name: str) -> float | None:
        """``name``'s value for this target (None: absent, never 0)."""
        if self.mig is None:
            return device.values.get(name)
        if name in MIG_SCOPED:
            return self.mig.values.get(name)
        if name.startswith(MIG_ABSENT_PREFIXES):
            return None
        return device.values.get(name)  # device-wide: temperature, power, clocks, errors


class DcgmSeries:
    """Series targets of each GPU.

    Args:
        hostname: the ``Hostname`` label.
        pods: Kubernetes attribution; None off Kubernetes (no pod labels, as
            dcgm-exporter without ``--kubernetes``).
    """

    def __init__(self, hostname: str, pods: PodAttribution | None = None) -> None:
        self._hostname = hostname
        self.pods = pods
        self._dicts: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], dict[str, str]] = {}

    def _series(
        self, labels: list[str], extra: dict[str, str], mig: MigReading | None, pod: PodRef | None
    ) -> Series:
        key = (tuple(labels), tuple(extra.items()))
        label_dict = self._dicts.get(key)
        if label_dict is None:
            if len(self._dicts) >= _LABEL_DICTS_KEPT:
                self._dicts.clear()  # GPUs, MIG layouts and pods churned: start again
            label_dict = self._dicts[key] = dict(zip(DCGM_LABELS, labels, strict=True)) | extra
        return Series(labels, extra, mig, pod, label_dict)

    def refresh(self) -> None:
        """Re-read the kubelet's allocations (cached; call once per collect)."""
        if self.pods is not None:
            self.pods.refresh()

    def of(self, device: DeviceReading) -> list[Series]:
        labels = device.dcgm_label_values(self._hostname)
        if not device.mig:
            pod = self._pod((device.uuid, device.device))
            return [self._series(labels, pod.labels() if pod else {}, None, pod)]
        out = []
        for mig in device.mig:
            pod = self._pod((mig.uuid, f"{device.device}/gi{mig.gpu_instance_id}"))
            extra = mig.label_values() | (pod.labels() if pod else {})
            out.append(self._series(labels, extra, mig, pod))
        return out

    def _pod(self, ids: tuple[str, ...]) -> PodRef | None:
        return None if self.pods is None else self.pods.lookup(i for i in ids if i)


__all__ = ["MIG_ABSENT_PREFIXES", "MIG_SCOPED", "DcgmSeries", "Series"]
