"""NVLink sampling through the field-values API (FC-04, FC-05).

For each GPU: find the links (``NVML_FI_DEV_NVLINK_LINK_COUNT``, else probe
until NVML says the link index is invalid), read every link's state with one
``nvmlDeviceGetFieldValues`` call (``NVML_FI_DEV_NVLINK_GET_STATE``; a link the
field cannot answer is asked with ``nvmlDeviceGetNvLinkState``), then read ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}``
(and ``RAW`` for link 0, dcgm-exporter's ``DCGM_FI_DEV_NVLINK_BANDWIDTH_L0``)
with one ``nvmlDeviceGetFieldValues`` call, one entry per active link
(``scopeId`` = link), and the error counters with another
(:mod:`.nvlink_errors`). Each entry's own ``nvmlReturn`` is checked: a
NOT_SUPPORTED entry marks the link unsupported instead of reading a zero. The
deprecated utilisation-counter API is never called and counters are never reset.
"""

from __future__ import annotations

from typing import Any

import pynvml

from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.fields import decode_entries, entry_return, field_value
from stormwatch.agent.gpu.model import LinkReading, NvlinkReading
from stormwatch.agent.gpu.nvlink_errors import TOTAL_METRICS, read_link_errors
from stormwatch.agent.gpu.nvml_errors import (
    UNSUPPORTED,
    ErrorSink,
    Unsupported,
    check,
    error_code,
)

KIB = 1024
_FIELDS_CALL = "nvmlDeviceGetFieldValues"
_STATE_CALL = "nvmlDeviceGetNvLinkState"

BANDWIDTH_TOTAL = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
BANDWIDTH_L0 = "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0"

#: Every per-GPU DCGM metric this module produces (for "unsupported" marking).
NVLINK_DCGM_METRICS: tuple[str, ...] = (
    BANDWIDTH_TOTAL,
    BANDWIDTH_L0,
    *(m.name for m in TOTAL_METRICS),
)


def _link_count(api: NvmlApi, handle: Any, sink: ErrorSink) -> int | None:
    try:
        (entry,) = api.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
    except pynvml.NVMLError as exc:
        check(_FIELDS_CALL, error_code(exc), sink, expected=UNSUPPORTED)
        return None
    if entry_return(entry) != pynvml.NVML_SUCCESS:
        check(_FIELDS_CALL, entry_return(entry), sink, expected=UNSUPPORTED)
        return None
    return int(field_value(entry))


def _states(api: NvmlApi, handle: Any, count: int | None, sink: ErrorSink) -> list[LinkReading]:
    """Each link's state: all known links in one field-values call, the rest (or all of
    them when the count is unknown or the driver lacks the field) one call per link."""
    limit = count if count is not None else pynvml.NVML_NVLINK_MAX_LINKS
    batched = _batched_states(api, handle, count, sink) if count else {}
    links: list[LinkReading] = []
    for link in range(limit):
        if link in batched:
            links.append(LinkReading(link, active=batched[link]))
            continue
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


#: ``NVML_FI_DEV_NVLINK_GET_STATE`` answers taken as they are (link -> active); any other
#: state (sleep, traffic disabled) is asked of ``nvmlDeviceGetNvLinkState``, whose answer
#: the agent has always exported.
_FIELD_STATES = {pynvml.NVML_NVLINK_STATE_ACTIVE: True, pynvml.NVML_NVLINK_STATE_INACTIVE: False}


def _batched_states(api: NvmlApi, handle: Any, count: int, sink: ErrorSink) -> dict[int, bool]:
    """Links ``0 .. count-1`` -> active, read with one ``nvmlDeviceGetFieldValues`` call
    (``NVML_FI_DEV_NVLINK_GET_STATE``, ``scopeId`` = link) instead of ``count``
    ``nvmlDeviceGetNvLinkState`` calls (18 per H100/H200). A link whose entry failed
    (a driver without the field answers NOT_SUPPORTED) or holds another state is left out,
    for the per-link call; a failed call is recorded (unless NOT_SUPPORTED) and leaves
    every link to it.

    Raises:
        DeviceDown: a device-fatal error.
    """
    field = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
    try:
        entries = api.nvmlDeviceGetFieldValues(handle, [(field, link) for link in range(count)])
    except pynvml.NVMLError as exc:
        check(_FIELDS_CALL, error_code(exc), sink, expected=UNSUPPORTED)
        return {}
    states: dict[int, bool] = {}
    for link, (ret, value) in enumerate(decode_entries(entries)):
        if ret == pynvml.NVML_SUCCESS:
            active = _FIELD_STATES.get(int(value))
            if active is not None:
                states[link] = active
    return states


_DIRECTIONS = (
    ("tx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
    ("rx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
)
_RAW = (
    ("raw_tx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX),
    ("raw_rx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX),
)


def _throughput(
    api: NvmlApi, handle: Any, active: list[int], sink: ErrorSink
) -> dict[int, LinkReading]:
    requests = [(link, direction, field) for link in active for direction, field in _DIRECTIONS]
    if 0 in active:
        requests.extend((0, direction, field) for direction, field in _RAW)
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
    for (link, direction, _), (ret, value) in zip(requests, decode_entries(entries), strict=True):
        if ret == pynvml.NVML_SUCCESS:
            seen[link][direction] = value * KIB
        elif check(_FIELDS_CALL, ret, sink, expected=UNSUPPORTED) in UNSUPPORTED:
            if not direction.startswith("raw"):
                unsupported[link] += 1
        elif not direction.startswith("raw"):
            failed.add(link)
    result: dict[int, LinkReading] = {}
    for link in active:
        values = seen[link]
        verdict: bool | None
        if "tx" in values or "rx" in values:
            verdict = True
        elif unsupported[link] == len(_DIRECTIONS):
            verdict = False
        else:
            verdict = None if link in failed else False
        result[link] = LinkReading(
            link,
            True,
            verdict,
            values.get("tx"),
            values.get("rx"),
            raw_tx_bytes=values.get("raw_tx"),
            raw_rx_bytes=values.get("raw_rx"),
        )
    return result


def _dcgm_totals(
    links: list[LinkReading], errors: dict[str, float | Unsupported]
) -> dict[str, float | Unsupported]:
    out: dict[str, float | Unsupported] = dict(errors)
    active = [link for link in links if link.active]
    if not active:
        return out  # nothing read this sample: neither a value nor a verdict
    supported = [link for link in active if link.supported]
    if supported:
        out[BANDWIDTH_TOTAL] = sum(
            (link.tx_bytes or 0.0) + (link.rx_bytes or 0.0) for link in supported
        )
    elif all(link.supported is False for link in active):
        out[BANDWIDTH_TOTAL] = Unsupported(
            "NVLink throughput fields are NOT_SUPPORTED on every active link (FC-04)"
        )
    first = links[0]
    if first.active and first.raw_tx_bytes is not None and first.raw_rx_bytes is not None:
        out[BANDWIDTH_L0] = first.raw_tx_bytes + first.raw_rx_bytes
    elif first.active and first.supported is False:
        out[BANDWIDTH_L0] = Unsupported("NVLink raw throughput fields NOT_SUPPORTED on link 0")
    return out


def sample_nvlink(api: NvmlApi, handle: Any, sink: ErrorSink) -> NvlinkReading:
    """Read every NVLink link of one GPU.

    Args:
        api: NVML.
        handle: the GPU's handle.
        sink: records failed calls (NOT_SUPPORTED / INVALID_ARGUMENT answers are
            capabilities, not failures, and are not recorded).

    Returns:
        ``NvlinkReading(present=False)`` for a GPU without NVLink, else one
        :class:`LinkReading` per link: inactive links have no throughput and no
        error counters; active links have ``supported`` True (with byte
        counters), False (NOT_SUPPORTED) or None (the read failed). ``dcgm``
        holds the per-GPU DCGM NVLink metrics (values or :class:`Unsupported`).

    Raises:
        DeviceDown: a device-fatal error (e.g. GPU_IS_LOST).
    """
    links = _states(api, handle, _link_count(api, handle, sink), sink)
    if not links:
        reason = Unsupported("this GPU has no NVLink")
        return NvlinkReading(present=False, dcgm=dict.fromkeys(NVLINK_DCGM_METRICS, reason))
    active = [link.link for link in links if link.active]
    errors: dict[str, float | Unsupported] = {}
    if active:
        rates = _throughput(api, handle, active, sink)
        per_link, errors = read_link_errors(api, handle, active, sink)
        links = [
            _with_errors(rates.get(link.link, link), per_link.get(link.link)) for link in links
        ]
    return NvlinkReading(present=True, links=tuple(links), dcgm=_dcgm_totals(links, errors))


def _with_errors(link: LinkReading, errors: dict[str, float] | None) -> LinkReading:
    if not errors:
        return link
    return LinkReading(
        link.link,
        link.active,
        link.supported,
        link.tx_bytes,
        link.rx_bytes,
        link.raw_tx_bytes,
        link.raw_rx_bytes,
        errors,
    )


__all__ = [
    "BANDWIDTH_L0",
    "BANDWIDTH_TOTAL",
    "KIB",
    "NVLINK_DCGM_METRICS",
    "field_value",
    "sample_nvlink",
]
