"""The agent's exception tree (drawn in :mod:`stormwatch.agent`).

The errors of the fault kinds themselves (``FaultError`` and its 400/404/409
subclasses) are :mod:`stormwatch.faults.errors`; the manager's own two derive from
both trees.
"""

from __future__ import annotations

from stormwatch.errors import ConfigError, StormwatchError
from stormwatch.faults.errors import FaultError


class AgentError(StormwatchError):
    """Anything the agent raises on purpose at run time."""


class AgentConfigError(AgentError, ConfigError):
    """An agent setting is invalid; the message names the field and the fix."""


class WebConfigError(AgentConfigError):
    """The ``--web-config-file`` (TLS, basic auth) is invalid; the message names the key."""


class NvmlUnavailable(AgentError):
    """``--gpu-backend nvml`` was asked for but NVML could not be initialised."""


class CollectorError(AgentError):
    """A collector cannot produce its metrics this scrape (reported as ``collector_up 0``)."""


class FaultNotFound(AgentError, FaultError):
    """No fault with this id in the ledger (HTTP 404)."""

    http_status = 404


class FaultConflict(AgentError, FaultError):
    """A fault id cannot take this request (HTTP 409): it is reused with a different body,
    or its fault failed when applied (a retry takes a new id)."""

    http_status = 409


class DeviceDown(AgentError):
    """Internal to the GPU sampler: a device-fatal NVML error (``GPU_IS_LOST`` ...); the
    device is reported down for this sample (``stormwatch_gpu_up 0``), never raised out of it."""


class PodResourcesError(AgentError):
    """The kubelet's pod-resources API did not answer (socket missing, refused, timeout)."""


class FaultsLeftApplied(AgentError):
    """A clean stop could not revert every applied fault (the CLI exits 1; the next start
    retries them from the ledger).

    Attributes:
        fault_ids: the faults still applied, oldest first.
    """

    def __init__(self, failures: list[tuple[str, str]]) -> None:
        self.fault_ids = tuple(fault_id for fault_id, _ in failures)
        reasons = "; ".join(f"{fault_id}: {why}" for fault_id, why in failures)
        super().__init__(
            f"{len(failures)} fault(s) still applied after the agent stopped ({reasons}); "
            "the next start of this agent (same --state-dir) retries the revert, or undo "
            "them by hand"
        )


class LedgerError(AgentError):
    """The fault ledger (SQLite under ``--state-dir``) cannot be opened or written."""


__all__ = [
    "AgentConfigError",
    "AgentError",
    "CollectorError",
    "DeviceDown",
    "FaultConflict",
    "FaultNotFound",
    "FaultsLeftApplied",
    "LedgerError",
    "NvmlUnavailable",
    "PodResourcesError",
    "WebConfigError",
]
