"""What every fault kind provides: a request model and an object with inject()/revert().

A fault kind is one module under ``agent/faults/`` defining

* a :class:`FaultSpec` subclass with ``kind: Literal["<kind>"]`` (the request body), and
* a :class:`Fault` subclass with ``kind``, ``spec_type`` and the three methods below,

and one entry in :data:`stormwatch.agent.faults.FAULT_TYPES`.

Life of a fault (driven by :class:`~stormwatch.agent.faults.manager.FaultManager`):
``prepare`` resolves the target without side effects (raising
``FaultTargetNotFound`` -> 404); the ledger then records the fault as
``injecting``; ``inject`` applies it and returns an :class:`Injection`, stored
in the ledger; ``revert`` undoes it. ``revert`` must be idempotent and must
work in a fresh process from the ledger entry alone (the agent may have been
restarted, or crashed between recording and applying: ``injection`` is then None).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

import psutil
from pydantic import BaseModel, ConfigDict, Field

from stormwatch.agent.watch.ranks import RankInfo

#: Longest accepted time-to-live (one day): a forgotten fault must still end.
MAX_TTL_SECONDS = 86_400.0


class FaultSpec(BaseModel):
    """Fields every fault request has.

    Attributes:
        id: caller-chosen id; the same id twice has one effect.
        kind: the fault kind (subclasses narrow it to a literal).
        ttl_seconds: the agent reverts the fault this long after applying it,
            on its own, even across restarts (default 300 s; at most one day).
    """

    # strict: JSON types are checked, not coerced ("0" is not a rank; true is not 1).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
    kind: str
    ttl_seconds: float = Field(default=300.0, gt=0, le=MAX_TTL_SECONDS)


class RankDirectory(Protocol):
    """What faults need from the rank watcher."""

    def alive(self, rank: int, job: str | None = None) -> list[tuple[RankInfo, psutil.Process]]: ...

    def scan(self) -> None: ...

    def check_owned(self, pid: int, create_time: float, key: tuple[str, int]) -> str | None: ...

    def ranks(self) -> tuple[RankInfo, ...]: ...


def _no_gpu() -> Any:
    return None


@dataclasses.dataclass(frozen=True)
class FaultContext:
    """The node-side resources a fault may act on.

    Attributes:
        node: this agent's node name.
        ranks: the rank watcher.
        metrics_dir: the node's metrics folder (``--metrics-dir``; trainer control files
            live in ``<metrics-dir>/control``), None when unknown.
        state_dir: the agent's state folder (scratch space of faults: overlay upper dirs).
        gpu: returns the agent's NVML backend (``pynvml`` or a ``FakeNvml``), None
            before it is open or without GPU collectors.
    """

    node: str
    ranks: RankDirectory
    metrics_dir: Path | None = None
    state_dir: Path | None = None
    gpu: Callable[[], Any] = _no_gpu


@dataclasses.dataclass(frozen=True)
class Injection:
    """What ``inject`` did, as stored in the ledger.

    Attributes:
        target_pid: the process acted on, if any.
        details: JSON-serialisable facts ``revert`` needs (or that a post-mortem wants).
    """

    target_pid: int | None = None
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Fault(abc.ABC):
    """One fault instance, built from its validated spec."""

    kind: ClassVar[str]
    spec_type: ClassVar[type[FaultSpec]]

    def __init__(self, spec: FaultSpec) -> None:
        if not isinstance(spec, self.spec_type):
            raise TypeError(f"{type(self).__name__} needs a {self.spec_type.__name__}")
        self.spec = spec

    @abc.abstractmethod
    def prepare(self, ctx: FaultContext) -> None:
        """Resolve the target; no side effects.

        Raises:
            FaultTargetNotFound: the target is not on this node.
            FaultTargetAmbiguous: the request matches more than one target.
        """

    @abc.abstractmethod
    def inject(self, ctx: FaultContext) -> Injection:
        """Apply the fault (after :meth:`prepare`).

        Raises:
            FaultError: it could not be applied.
        """

    @abc.abstractmethod
    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Undo the fault. Idempotent; must work from the ledger entry alone.

        Raises:
            FaultError: it could not be undone (the agent retries later).
        """


__all__ = [
    "MAX_TTL_SECONDS",
    "Fault",
    "FaultContext",
    "FaultSpec",
    "Injection",
    "RankDirectory",
]
