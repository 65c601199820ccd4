"""Bounds every fault declaration shares, defined once (agent requests and experiment files).

Each is an ``Annotated`` type (a pydantic ``Field`` constraint inside), so a model
field written ``rank: Rank`` is checked the same way wherever it appears.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

#: Longest fault time-to-live: one day. A forgotten fault must still end; a fault that must
#: outlive a day is a mistake.
MAX_TTL_SECONDS = 86_400.0
#: Default TTL of a request sent straight to an agent's fault API, seconds.
AGENT_TTL_SECONDS = 300.0
#: Default TTL of a fault in an experiment file, seconds (a kind may choose another).
EXPERIMENT_TTL_SECONDS = 60.0
#: Node names (lab ``node0``, a Kubernetes node, a Slurm host): letters, digits, ``_.-``.
NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
#: Fault ids (``<experiment-id>.<action>``, ``:<node>`` per partition side).
FAULT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
#: Highest global rank a fault may name (65,536 ranks: far above any job we target).
MAX_RANK = 65_535
#: Highest GPU index and NVLink link index on a node (NVML numbers both from 0; 64 is ample).
MAX_GPU_INDEX = 63

NodeName = Annotated[str, Field(pattern=NODE_NAME_PATTERN)]
Rank = Annotated[int, Field(ge=0, le=MAX_RANK)]
GpuIndex = Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]
LinkIndex = Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]
JobName = Annotated[str, Field(min_length=1)]
FaultId = Annotated[str, Field(pattern=FAULT_ID_PATTERN)]
TtlSeconds = Annotated[float, Field(gt=0, le=MAX_TTL_SECONDS)]
#: Signals a kill may send: ``SIGKILL`` (a crash) or ``SIGTERM`` (a graceful stop).
Signal = Literal["SIGKILL", "SIGTERM"]

__all__ = [
    "AGENT_TTL_SECONDS",
    "EXPERIMENT_TTL_SECONDS",
    "FAULT_ID_PATTERN",
    "MAX_GPU_INDEX",
    "MAX_RANK",
    "MAX_TTL_SECONDS",
    "NODE_NAME_PATTERN",
    "FaultId",
    "GpuIndex",
    "JobName",
    "LinkIndex",
    "NodeName",
    "Rank",
    "Signal",
    "TtlSeconds",
]
