"""Root of stormwatch's exception tree.

::

    StormwatchError                 anything stormwatch raises on purpose
    ├── ConfigError                 bad user input: names the field and the fix (exit 2)
    │   └── stormwatch.trainer.UnwritableDirError   an output folder cannot be written
    ├── DatabaseError               stormwatch.sqlite: a database cannot be opened or migrated
    │   └── SchemaTooNewError       written by a newer stormwatch (names the file and the fix)
    ├── PortConflictError           stormwatch.ports: a port stayed in use through every retry
    ├── stormwatch.clients.ClientError   a service's HTTP API failed (attribute ``status``)
    │   ├── PrometheusAPIError      the Prometheus HTTP API
    │   ├── ResponderClientError    the responder's HTTP API
    │   └── GrafanaAPIError         Grafana's HTTP API (dashboards, folders, annotations)
    ├── stormwatch.platforms.PlatformError
    │   ├── BackendError            a platform backend could not act (no such worker, ...)
    │   │   └── NotStopped          a stop's processes, steps or pods not confirmed gone
    │   ├── InvalidTargetFile       (a ConfigError too) a target file is not valid
    │   └── InvalidManifest         (a ConfigError too) a Kubernetes job manifest is not valid
    ├── stormwatch.faults.FaultError    a fault could not be placed, applied or undone (HTTP 500)
    │   ├── InvalidFaultRequest     (a ConfigError too; 400)
    │   ├── FaultTargetNotFound     (404)
    │   ├── FaultTargetAmbiguous    (409)
    │   └── UnplaceableFault        the controller cannot place it on the agents
    ├── stormwatch.agent.AgentError
    │   ├── AgentConfigError        (a ConfigError too) bad setting, state dir held elsewhere
    │   │   └── WebConfigError      bad --web-config-file (TLS, basic auth)
    │   ├── NvmlUnavailable         --gpu-backend nvml without a working driver
    │   ├── CollectorError          a collector cannot collect (collector_up 0)
    │   ├── DeviceDown              internal to the GPU sampler: a device-fatal NVML error
    │   ├── LedgerError             the agent's fault ledger cannot be opened or written
    │   ├── FaultsLeftApplied       a clean stop left faults applied (the next start retries)
    │   ├── PodResourcesError       the kubelet's pod-resources socket did not answer
    │   ├── FaultNotFound           (a stormwatch.faults.FaultError too; 404)
    │   └── FaultConflict           (likewise; 409)
    ├── stormwatch.trainer.TrainerError
    │   ├── CorpusError             corpus unreadable or too small
    │   ├── CheckpointError         save/resume failed (raised on every rank together)
    │   │   └── ResumeRefused       (a ConfigError too; exit 2) damaged or mismatched checkpoints
    │   ├── Terminated              SIGTERM received (torchrun teardown); exit status 143
    │   ├── InjectedFault           the ``error_at_step`` fault point fired
    │   └── ControlFileError        a control file does not parse (never raised out of training)
    ├── stormwatch.chaos.ChaosError
    │   ├── InvalidExperiment       (a ConfigError too)
    │   ├── LabNotReady             (a ConfigError too)
    │   ├── SelectionError          a selector names a node or rank the job does not have
    │   ├── FaultError              a fault could not be located, injected or reverted
    │   │   └── RankNotFound        the agent asked does not hold the rank
    │   ├── ActivityFailed          an activity of the method failed
    │   ├── RollbackFailed
    │   ├── LedgerError             the controller's fault ledger
    │   └── ServiceError            an agent or the responder failed or is unreachable
    ├── stormwatch.lab.LabError
    │   ├── LabPermissionError      (a ConfigError too)
    │   ├── PortInUseError          (a ConfigError too)
    │   ├── LabNotUpError           no lab in the run dir (a ConfigError too)
    │   │   └── LabNotFoundError    lab down: nothing of a lab in the run dir
    │   ├── LabOwnedElsewhereError  (a ConfigError too)
    │   ├── ServiceFailedError
    │   ├── SlurmError              the lab's Slurm cluster could not be set up or taken apart
    │   └── JobError
    │       └── JobTimeoutError
    ├── stormwatch.alerts.AlertsError
    │   ├── ToolError               promtool/amtool missing or failing
    │   ├── StoreError              the responder's SQLite database
    │   │   └── NotAResponderDatabase   (a ConfigError too)
    │   └── UnknownIncident         (a ConfigError too)
    ├── stormwatch.dashboards.DashboardsError
    │   └── PushError               Grafana unreachable or refusing a request
    └── stormwatch.plan.PlanError
        └── InvalidPlanInput        (a ConfigError too)

Each class lives in its package's ``errors`` module (``stormwatch/errors.py`` for the
root, ``<package>/errors.py`` otherwise: :mod:`stormwatch.agent.errors`, ...), and
each package docstring draws its own branch; ``tests/test_layout.py`` checks that
every exception class is defined in an errors module and drawn here under one of
its bases. A name under a dotted heading belongs to that heading's package.

The shared clients (:mod:`stormwatch.clients`), platform backends
(:mod:`stormwatch.platforms`) and the SQLite helper (:mod:`stormwatch.sqlite`) raise the
classes above (the post-mortem engine, :mod:`stormwatch.postmortem`, and the shared
contracts, :mod:`stormwatch.contracts`, raise none of their own); each component
catches them where it acts on them. The CLI prints a :class:`StormwatchError` as one
clear message (no traceback) and exits with :attr:`StormwatchError.exit_code`. Foreign exceptions are wrapped once, at the boundary,
with ``raise ... from exc``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


class StormwatchError(Exception):
    """Base class of every error stormwatch raises on purpose.

    Attributes:
        exit_code: process exit status the CLI uses for this error (1).
    """

    exit_code: int = 1


class ConfigError(StormwatchError, ValueError):
    """A user-supplied value is invalid.

    The message names the offending field (and file, where there is one) and
    says what is allowed, e.g. ``experiment.yaml: method[0].fault.rank: must be
    >= 0 (got -1)``.
    """

    exit_code = 2


class DatabaseError(StormwatchError):
    """A SQLite database (:mod:`stormwatch.sqlite`) cannot be opened, read or migrated.

    Attributes:
        path: the database file.
    """

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = Path(path)


class SchemaTooNewError(DatabaseError):
    """The database was written by a newer stormwatch (its ``PRAGMA user_version`` is above
    the newest migration this code knows); nothing was changed.

    Attributes:
        found: the database's schema version.
        known: the newest version this code knows.
    """

    def __init__(self, message: str, *, path: Path, found: int, known: int) -> None:
        super().__init__(message, path=path)
        self.found = found
        self.known = known


class PortConflictError(StormwatchError):
    """A port stayed in use (``EADDRINUSE``) through every retry of :mod:`stormwatch.ports`.

    Attributes:
        port: the port, when known.
    """

    def __init__(self, message: str, *, port: int | None = None) -> None:
        super().__init__(message)
        self.port = port


def cause_chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what it was raised from: each cause, else the context unless
    ``raise ... from None`` suppressed it (as a traceback shows them); each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )


__all__ = [
    "ConfigError",
    "DatabaseError",
    "PortConflictError",
    "SchemaTooNewError",
    "StormwatchError",
    "cause_chain",
]
