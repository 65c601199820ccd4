"""stormwatch.chaos: chaos experiments against a training job, with a durable fault ledger.

An experiment (YAML, :mod:`.experiment`) has a steady-state hypothesis checked
before and after a method that injects typed faults (the kinds of
:mod:`stormwatch.faults`, applied by the node agents or, ``freeze_rank``, by the
controller). :mod:`.execution` runs it against a :mod:`.target`, writes every
fault to the :mod:`.ledger` *before* sending it (:mod:`.execution.injection`), and
reverts whatever is open however the run ends (FC-13, :mod:`.ledger.undo`). Every activity is
journaled (the journal and the ledger row are shared contracts:
:mod:`stormwatch.contracts.journal`, :mod:`stormwatch.contracts.fault_ledger`);
:mod:`.reports.experiment_report` turns the journal, the rank logs, a baseline run and
the alert/responder :mod:`.reports.evidence` into the post-mortem engine's report
(:mod:`stormwatch.postmortem`). :mod:`.gameday` runs suites of experiments into a
scorecard and the demo. ``stormwatch chaos`` is :mod:`.cli` (one module per command
group); ``stormwatch demo``
is :mod:`.gameday.demo`.

Exceptions (all :class:`stormwatch.errors.StormwatchError`)::

    ChaosError                  the controller could not do something
    ├── InvalidExperiment       experiment file invalid: file, field path, what is allowed
    │                           (also a ConfigError: exit 2, nothing started)
    ├── LabNotReady             no lab / a needed service is down (also a ConfigError)
    ├── SelectionError          a selector names a node or rank the job does not have
    ├── FaultError              a fault could not be located, injected or reverted
    │   └── RankNotFound        the agent asked does not hold the rank (nothing happened)
    ├── ActivityFailed          an activity of the method failed (its record says why)
    ├── RollbackFailed          a rollback or revert failed (the fault stays open)
    ├── LedgerError             the SQLite ledger cannot be read or written
    └── ServiceError            an agent or the responder failed or is unreachable
"""

from stormwatch.chaos.errors import (
    ChaosError,
    FaultError,
    InvalidExperiment,
    Issue,
    LabNotReady,
    LedgerError,
    RankNotFound,
    RollbackFailed,
    ServiceError,
)
from stormwatch.chaos.execution.runner import ExperimentRun, Runner, RunnerConfig, run_experiment
from stormwatch.chaos.experiment.loader import load_experiment, parse_experiment
from stormwatch.chaos.experiment.model import Experiment
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.ledger.revert import RevertOutcome, revert_open
from stormwatch.chaos.platform_target import resolve_target, target_from_file
from stormwatch.chaos.reports.experiment_report import analyze
from stormwatch.chaos.target import AttachedJobs, Target, lab_target

__all__ = [
    "AttachedJobs",
    "ChaosError",
    "Experiment",
    "ExperimentRun",
    "FaultError",
    "InvalidExperiment",
    "Issue",
    "LabNotReady",
    "Ledger",
    "LedgerError",
    "RankNotFound",
    "RevertOutcome",
    "RollbackFailed",
    "Runner",
    "RunnerConfig",
    "ServiceError",
    "Target",
    "analyze",
    "lab_target",
    "ledger_path",
    "load_experiment",
    "parse_experiment",
    "resolve_target",
    "revert_open",
    "run_experiment",
    "target_from_file",
]
