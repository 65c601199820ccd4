"""stormwatch.agent: the per-node agent (``stormwatch agent run``).

Serves ``/metrics`` (dcgm-exporter-compatible GPU metrics from real or
simulated NVML, host metrics, the trainer's multiprocess metrics, the rank
watcher's view), ``/healthz``, ``/v1/ranks`` and an authenticated fault API
with a durable ledger. Layout: :mod:`.config`, :mod:`.catalogue` (+
``catalogue.csv``), :mod:`.gpu` (NVML backends and sampler), :mod:`.watch` (the rank
watcher, its process discovery, the trainer's files, hang / straggler detectors and
their monitor, hang diagnostics, ``events.jsonl`` for ``/v1/events``), :mod:`.collectors`
(one module per collector), :mod:`.exposition` (the cached ``/metrics``), :mod:`.faults`
(the fault API's manager and ledger; the kinds are :mod:`stormwatch.faults`),
:mod:`.server` (HTTP), :mod:`.webconfig` (TLS, basic auth), :mod:`.tracing` (the agent's
own spans, FC-07/FC-08), :mod:`.statelock` (one agent per state dir), :mod:`.assembly`
(one builder per subsystem), :mod:`.runtime` (:class:`Agent`, which wires them),
:mod:`.cli`.

Exceptions::

    StormwatchError
    └── AgentError
        ├── AgentConfigError        (a ConfigError too) bad setting; names field and fix
        │   │                       (also: state dir held by another agent)
        │   └── WebConfigError      bad --web-config-file (TLS, basic auth); names the key
        ├── NvmlUnavailable         --gpu-backend nvml without a working driver
        ├── CollectorError          a collector cannot collect (collector_up 0)
        ├── DeviceDown              internal to the GPU sampler: a device-fatal NVML error
        ├── LedgerError             the fault ledger cannot be opened or written
        ├── FaultsLeftApplied       a clean stop left faults applied (the next start retries)
        ├── PodResourcesError       the kubelet's pod-resources socket did not answer
        ├── FaultNotFound           unknown fault id (404; a stormwatch.faults.FaultError too)
        └── FaultConflict           fault id reused with another request (409; likewise)

The fault kinds raise :mod:`stormwatch.faults.errors` (``FaultError`` -> 500,
``InvalidFaultRequest`` 400, ``FaultTargetNotFound`` 404, ``FaultTargetAmbiguous`` 409).
"""

from stormwatch.agent.catalogue import Catalogue, MetricSpec, load_catalogue
from stormwatch.agent.config import COLLECTOR_NAMES, AgentConfig
from stormwatch.agent.errors import (
    AgentConfigError,
    AgentError,
    CollectorError,
    FaultConflict,
    FaultNotFound,
    FaultsLeftApplied,
    LedgerError,
    NvmlUnavailable,
    WebConfigError,
)
from stormwatch.agent.faults import FaultManager, FaultRecord
from stormwatch.agent.gpu import FakeNvml, GpuSampler
from stormwatch.agent.runtime import Agent
from stormwatch.agent.tracing import AgentTracing, TracingSettings
from stormwatch.agent.watch.detectors import HangSettings, StragglerSettings
from stormwatch.agent.watch.events import EventLog
from stormwatch.agent.watch.monitor import RankHealth
from stormwatch.agent.watch.ranks import RankExit, RankInfo, RankWatcher

__all__ = [
    "COLLECTOR_NAMES",
    "Agent",
    "AgentConfig",
    "AgentConfigError",
    "AgentError",
    "AgentTracing",
    "Catalogue",
    "CollectorError",
    "EventLog",
    "FakeNvml",
    "FaultConflict",
    "FaultManager",
    "FaultNotFound",
    "FaultRecord",
    "FaultsLeftApplied",
    "GpuSampler",
    "HangSettings",
    "LedgerError",
    "MetricSpec",
    "NvmlUnavailable",
    "RankExit",
    "RankHealth",
    "RankInfo",
    "RankWatcher",
    "StragglerSettings",
    "TracingSettings",
    "WebConfigError",
    "load_catalogue",
]
