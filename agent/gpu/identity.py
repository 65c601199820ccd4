"""Who a GPU is: the dcgm-exporter label values and the "label" fields of its CSV.

``gpu, UUID, pci_bus_id, device, modelName, Hostname`` label every DCGM series;
dcgm-exporter's CSV also lists *label* fields (``DCGM_FI_DRIVER_VERSION`` on by
default; NVML version, brand, serial, InfoROM and VBIOS versions commented
out). The agent reads them all once per handle and exports them on
``stormwatch_gpu_info`` under their DCGM field names, so a dashboard can join
them onto any DCGM series (``* on(gpu, Hostname) group_left(DCGM_FI_DRIVER_VERSION)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.nvml_errors import CALL_UNSUPPORTED, ErrorSink, check, error_code

#: dcgm-exporter label fields, in CSV order (label names of ``stormwatch_gpu_info``).
INFO_FIELDS: tuple[str, ...] = (
    "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_NVML_VERSION",
    "DCGM_FI_DEV_BRAND",
    "DCGM_FI_DEV_SERIAL",
    "DCGM_FI_DEV_OEM_INFOROM_VER",
    "DCGM_FI_DEV_ECC_INFOROM_VER",
    "DCGM_FI_DEV_POWER_INFOROM_VER",
    "DCGM_FI_DEV_INFOROM_IMAGE_VER",
    "DCGM_FI_DEV_VBIOS_VERSION",
)

#: ``nvmlBrandType_t`` value -> name (``NVML_BRAND_TESLA`` -> ``TESLA``).
BRAND_NAMES: dict[int, str] = {}
for _name in sorted(dir(pynvml)):
    if _name.startswith("NVML_BRAND_") and _name != "NVML_BRAND_COUNT":
        BRAND_NAMES.setdefault(int(getattr(pynvml, _name)), _name.removeprefix("NVML_BRAND_"))


@dataclasses.dataclass(frozen=True)
class Identity:
    """A GPU's handle and labels.

    Attributes:
        handle: NVML handle.
        uuid, pci_bus_id, name: DCGM label values ("" when NVML failed).
        info: label field name (:data:`INFO_FIELDS`) -> value ("" when unknown).
    """

    handle: Any
    uuid: str
    pci_bus_id: str
    name: str
    info: Mapping[str, str]

    @property
    def complete(self) -> bool:
        """Every DCGM label is known (incomplete identities are re-read next sample)."""
        return bool(self.uuid and self.pci_bus_id and self.name)


def system_info(api: NvmlApi, sink: ErrorSink) -> dict[str, str]:
    """Node-wide label fields: driver and NVML versions ("" when NVML failed)."""
    return {
        "DCGM_FI_DRIVER_VERSION": _text(
            "nvmlSystemGetDriverVersion", api.nvmlSystemGetDriverVersion, sink
        ),
        "DCGM_FI_NVML_VERSION": _text(
            "nvmlSystemGetNVMLVersion", api.nvmlSystemGetNVMLVersion, sink
        ),
    }


def read_identity(
    api: NvmlApi, handle: Any, sink: ErrorSink, system: Mapping[str, str]
) -> Identity:
    """Labels of the GPU behind ``handle``.

    Raises:
        DeviceDown: a device-fatal NVML error.
    """

    def text(call: str, read: Callable[[], Any], *, optional: bool = False) -> str:
        return _text(call, read, sink, optional=optional)

    brand = text("nvmlDeviceGetBrand", lambda: api.nvmlDeviceGetBrand(handle), optional=True)
    if brand:
        brand = BRAND_NAMES.get(int(brand), brand)
    info = {
        **system,
        "DCGM_FI_DEV_BRAND": brand,
        "DCGM_FI_DEV_SERIAL": text(
            "nvmlDeviceGetSerial", lambda: api.nvmlDeviceGetSerial(handle), optional=True
        ),
        "DCGM_FI_DEV_OEM_INFOROM_VER": _inforom(api, handle, pynvml.NVML_INFOROM_OEM, sink),
        "DCGM_FI_DEV_ECC_INFOROM_VER": _inforom(api, handle, pynvml.NVML_INFOROM_ECC, sink),
        "DCGM_FI_DEV_POWER_INFOROM_VER": _inforom(api, handle, pynvml.NVML_INFOROM_POWER, sink),
        "DCGM_FI_DEV_INFOROM_IMAGE_VER": text(
            "nvmlDeviceGetInforomImageVersion",
            lambda: api.nvmlDeviceGetInforomImageVersion(handle),
            optional=True,
        ),
        "DCGM_FI_DEV_VBIOS_VERSION": text(
            "nvmlDeviceGetVbiosVersion",
            lambda: api.nvmlDeviceGetVbiosVersion(handle),
            optional=True,
        ),
    }
    return Identity(
        handle=handle,
        uuid=text("nvmlDeviceGetUUID", lambda: api.nvmlDeviceGetUUID(handle)),
        pci_bus_id=text("nvmlDeviceGetPciInfo", lambda: api.nvmlDeviceGetPciInfo(handle).busId),
        name=text("nvmlDeviceGetName", lambda: api.nvmlDeviceGetName(handle)),
        info=info,
    )


def _inforom(api: NvmlApi, handle: Any, obj: int, sink: ErrorSink) -> str:
    return _text(
        "nvmlDeviceGetInforomVersion",
        lambda: api.nvmlDeviceGetInforomVersion(handle, obj),
        sink,
        optional=True,
    )


def _text(call: str, read: Callable[[], Any], sink: ErrorSink, *, optional: bool = False) -> str:
    """``str(read())``, or "" when NVML fails (recorded unless a capability answer of an optional label)."""
    try:
        value = read()
    except pynvml.NVMLError as exc:
        check(call, error_code(exc), sink, expected=CALL_UNSUPPORTED if optional else frozenset())
        return ""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return str(value)


__all__ = ["BRAND_NAMES", "INFO_FIELDS", "Identity", "read_identity", "system_info"]
