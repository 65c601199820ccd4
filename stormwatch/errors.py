"""Root of stormwatch's exception tree.

::

    StormwatchError                 anything stormwatch raises on purpose
    ├── ConfigError                 bad user input: names the field and the fix
    ├── stormwatch.faults.FaultError    a fault could not be placed, applied or undone (HTTP 500)
    │   ├── InvalidFaultRequest     (a ConfigError too; 400)
    │   ├── FaultTargetNotFound     (404)
    │   ├── FaultTargetAmbiguous    (409)
    │   └── UnplaceableFault        the controller cannot place it on the agents
    ├── stormwatch.agent.AgentError
    │   ├── FaultNotFound           (a stormwatch.faults.FaultError too; 404)
    │   └── FaultConflict           (likewise; 409)
    ├── stormwatch.trainer.TrainerError
    ├── stormwatch.chaos.ChaosError
    │   ├── InvalidExperiment       (a ConfigError too)
    │   ├── FaultError
    │   └── RollbackFailed
    ├── stormwatch.lab.LabError
    └── stormwatch.alerts.AlertsError

The CLI prints a :class:`StormwatchError` as one clear message (no traceback)
and exits with :attr:`StormwatchError.exit_code`. Foreign exceptions are
wrapped once, at the boundary, with ``raise ... from exc``.
"""

from __future__ import annotations


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


__all__ = ["ConfigError", "StormwatchError"]
