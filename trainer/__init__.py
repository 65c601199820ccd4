"""stormwatch.trainer: the reference 3-D parallel trainer (PP x FSDP2/HSDP x DTensor TP), the system under test.

A byte-level decoder-only transformer trained on the Python standard
library's source (:mod:`~stormwatch.trainer.data.corpus`), split into pipeline
stages and sharded with tensor parallelism and FSDP2 (or HSDP) over a
``(pp, dp_replicate, dp_shard, tp)`` device mesh, checkpointed with
DCP so that a rank killed mid-run resumes to bitwise-identical losses, and
instrumented through the public telemetry API :mod:`stormwatch.telemetry` alone (the
per-rank telemetry of docs/ARCHITECTURE.md, as any job gets it).

Modules, one responsibility each: ``config/`` (frozen configs; every option of
``stormwatch train`` is declared on the field it sets), ``parallel/`` (``dims``:
:class:`ParallelDims`, the mesh; ``apply``: :func:`parallelize`; ``pipeline``:
stage split and schedule), ``model``, ``data/`` (``corpus``; ``batches``:
deterministic batches), ``checkpoint/`` (``checkpointer``: DCP sync/async save
and resume; ``state``: what a checkpoint holds; ``store``: crash-safe layout with
checksums; ``budget``: failed saves a job trains through; ``cadence``: when the
loop saves), ``instrument`` (grad norm, memory, the model's FLOPs per token),
``control`` (fault points armed per rank through the control file of
:mod:`stormwatch.faults.control_file`), ``runtime`` (rank environment, process
group, collective timeout), ``paths`` (start-up check that output folders are writable),
``progress`` (rank 0's progress lines on stderr), ``loop`` (a rank's set-up and
life), ``steps`` (its optimizer steps), ``passes`` (a step's forward and
backward), ``evaluation`` (forward-only passes over held-out batches, phase ``eval``),
``cli`` (``stormwatch train``).

Exceptions::

    StormwatchError
    ├── ConfigError          bad option or environment value (names the field)
    │   └── UnwritableDirError  an output folder cannot be created or written
    └── TrainerError
        ├── CorpusError      corpus unreadable or too small
        ├── CheckpointError  save/resume failed (raised on every rank together)
        │   └── ResumeRefused  (a ConfigError too; exit 2) every checkpoint damaged, or
        │                      the latest written with settings this run changes
        ├── Terminated       SIGTERM received (torchrun teardown); exit status 143
        ├── InjectedFault    the ``error_at_step`` fault point fired
        └── ControlFileError a control file does not parse (logged, never raised
                             out of training)

Names that need torch (:func:`parallelize`, :func:`train`, ...) are imported
on first use, so importing this package, or running ``stormwatch --help``,
does not pay for ``import torch``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stormwatch.trainer.config import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    TelemetryConfig,
    TrainConfig,
)
from stormwatch.trainer.data.corpus import Corpus, load_stdlib_corpus
from stormwatch.trainer.errors import (
    CheckpointError,
    ControlFileError,
    CorpusError,
    InjectedFault,
    ResumeRefused,
    Terminated,
    TrainerError,
    UnwritableDirError,
)
from stormwatch.trainer.parallel.dims import ParallelDims
from stormwatch.trainer.progress import ConsoleProgress
from stormwatch.trainer.runtime import RankEnv

if TYPE_CHECKING:
    from stormwatch.trainer.checkpoint.checkpointer import Checkpointer
    from stormwatch.trainer.data.batches import BatchSampler
    from stormwatch.trainer.loop import TrainResult, train
    from stormwatch.trainer.model import ByteLM
    from stormwatch.trainer.parallel.apply import parallelize

_LAZY = {
    "BatchSampler": "stormwatch.trainer.data.batches",
    "ByteLM": "stormwatch.trainer.model",
    "Checkpointer": "stormwatch.trainer.checkpoint.checkpointer",
    "TrainResult": "stormwatch.trainer.loop",
    "parallelize": "stormwatch.trainer.parallel.apply",
    "train": "stormwatch.trainer.loop",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "BatchSampler",
    "ByteLM",
    "CheckpointConfig",
    "CheckpointError",
    "Checkpointer",
    "ConsoleProgress",
    "ControlFileError",
    "Corpus",
    "CorpusError",
    "DataConfig",
    "InjectedFault",
    "ModelConfig",
    "OptimConfig",
    "ParallelDims",
    "RankEnv",
    "ResumeRefused",
    "TelemetryConfig",
    "Terminated",
    "TrainConfig",
    "TrainResult",
    "TrainerError",
    "UnwritableDirError",
    "load_stdlib_corpus",
    "parallelize",
    "train",
]
