"""NVLink sampling through the field-values API (FC-04, FC-05).

For each GPU: find the links (``NVML_FI_DEV_NVLINK_LINK_COUNT``, else probe
until NVML says the link index is invalid), check each link's state with
``nvmlDeviceGetNvLinkState``, then read ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}``
with one ``nvmlDeviceGetFieldValues`` call, one entry per active link
(``scopeId`` = link). Each entry's own ``nvmlReturn`` is checked: a
NOT_SUPPORTED entry marks the link unsupported instead of reading a zero. The
deprecated utilisation-counter API is never called and counters are never reset.
"""

from __future__ import annotations

from typing import Any

import pynvml
from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.model import LinkReading, NvlinkReading
from stormwatch.agent.gpu.nvml_errors import UNSUPPORTED, ErrorSink, check, error_code

KIB = 1024
_FIELDS_CALL = "nvmlDeviceGetFieldValues"
_STATE_CALL = "nvmlDeviceGetNvLinkState"


def field_value(entry: Any) -> float:
    """The value of a ``c_nvmlFieldValue_t`` according to its ``valueType``."""
    kind = entry.valueType
    if kind == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(entry.value.dVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(entry.value.uiVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(entry.value.ulVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(entry.value.sllVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return float(entry.value.siVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return float(entry.value.usVal)
    return float(entry.value.ullVal)


def _link_count(api: NvmlApi, handle: Any, sink: ErrorSink) -> int | None:
    try:
        (entry,) = api.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
    except pynvml.NVMLError as exc:
        check(_FIELDS_CALL, error_code(exc), sink, expected=UNSUPPORTED)
        return None
    if entry.nvmlReturn != pynvml.NVML_SUCCESS:
        check(_FIELDS_CALL, int(entry.nvmlReturn), sink, expected=UNSUPPORTED)
        return None
    return int(field_value(entry))


def _states(api: NvmlApi, handle: Any, count: int | None, sink: ErrorSink) -> list[LinkReading]:
    limit = count if count is not None else pynvml.NVML_NVLINK_MAX_LINKS
    links: list[LinkReading] = []
    for link in range(limit):
        try:
            state = api.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError as exc:
            code = check(_STATE_CALL, error_code(exc), sink, expected=UNSUPPORTED)
            if code in UNSUPPORTED:
                if count is None:
                    break  # probing: past the last link (or no NVLink at all)
                links.append(LinkReading(link, active=None, supported=False))
            else:
                links.append(LinkReading(link, active=None))
            continue
        links.append(LinkReading(link, active=state == pynvml.NVML_FEATURE_ENABLED))
    return links


def _throughput(
    api: NvmlApi, handle: Any, active: list[int], sink: ErrorSink
) -> dict[int, LinkReading]:
    directions = (
        ("tx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
        ("rx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
    )
    requests = [(link, direction, field) for link in active for direction, field in directions]
    try:
        entries = api.nvmlDeviceGetFieldValues(
            handle, [(field, link) for link, _, field in requests]
        )
    except pynvml.NVMLError as exc:
        code = check(_FIELDS_CALL, error_code(exc), sink, expected=UNSUPPORTED)
        supported = False if code in UNSUPPORTED else None
        return {link: LinkReading(link, True, supported) for link in active}
    seen: dict[int, dict[str, float]] = {link: {} for link in active}
    unsupported: dict[int, int] = dict.fromkeys(active, 0)
    failed: set[int] = set()
    for (link, direction, _), entry in zip(requests, entries, strict=True):
        ret = int(entry.nvmlReturn)
        if ret == pynvml.NVML_SUCCESS:
            seen[link][direction] = field_value(entry) * KIB
        elif check(_FIELDS_CALL, ret, sink, expected=UNSUPPORTED) in UNSUPPORTED:
            unsupported[link] += 1
        else:
            failed.add(link)
    result: dict[int, LinkReading] = {}
    for link in active:
        values = seen[link]
        verdict: bool | None
        if values:
            verdict = True
        elif unsupported[link] == len(directions):
            verdict = False
        else:
            verdict = None if link in failed else False
        result[link] = LinkReading(link, True, verdict, values.get("tx"), values.get("rx"))
    return result


def sample_nvlink(api: NvmlApi, handle: Any, sink: ErrorSink) -> NvlinkReading:
    """Read every NVLink link of one GPU.

    Args:
        api: NVML.
        handle: the GPU's handle.
        sink: records failed calls (NOT_SUPPORTED / INVALID_ARGUMENT answers are
            capabilities, not failures, and are not recorded).

    Returns:
        ``NvlinkReading(present=False)`` for a GPU without NVLink, else one
        :class:`LinkReading` per link: inactive links have no throughput;
        active links have ``supported`` True (with byte counters), False
        (NOT_SUPPORTED) or None (the read failed).

    Raises:
        DeviceDown: a device-fatal error (e.g. GPU_IS_LOST).
    """
    links = _states(api, handle, _link_count(api, handle, sink), sink)
    if not links:
        return NvlinkReading(present=False)
    active = [link.link for link in links if link.active]
    if active:
        rates = _throughput(api, handle, active, sink)
        links = [rates.get(link.link, link) for link in links]
    return NvlinkReading(present=True, links=tuple(links))


__all__ = ["KIB", "field_value", "sample_nvlink"]
