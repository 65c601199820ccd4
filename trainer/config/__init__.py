"""Small frozen configs, one per trainer component, validated at construction.

No torch import here: the CLI validates every option before it pays for
``import torch``. Each component receives only its own config
(:class:`ModelConfig` to the model, :class:`CheckpointConfig` to the
checkpointer, ...); :class:`TrainConfig` only groups them for the loop and
checks the constraints that span two of them (e.g. heads divisible by ``tp``).

Every option of ``stormwatch train`` is declared once, on the field it sets
(:func:`~stormwatch.trainer.config.options.option`: flags, help, environment
variable, choices, range, default); the command's click options are derived
from these declarations (:func:`~stormwatch.trainer.config.options.click_options`).

Modules: :mod:`.learning` (model, data, optimizer, evaluation), :mod:`.resilience`
(checkpoints, chaos control channel, hang dumps), :mod:`.reporting` (telemetry,
spans, progress lines), :mod:`.run` (:class:`TrainConfig`), :mod:`.options`
(option declarations and the click options derived), :mod:`.checks` (the
field checks, whose messages name the field).

Defaults are sized for CPU speed (a few milliseconds per step on one core), not
for language-model quality: the trainer is the system under test for
observability and chaos experiments.
"""

from stormwatch.trainer.config.learning import (
    DEFAULT_CORPUS_MAX_BYTES,
    SEED_LIMIT,
    VOCAB_SIZE,
    DataConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
)
from stormwatch.trainer.config.reporting import (
    DEFAULT_LOG_EVERY,
    ProgressConfig,
    TelemetryConfig,
    TracingConfig,
    check_otlp_available,
)
from stormwatch.trainer.config.resilience import (
    CHECKPOINT_MODES,
    CheckpointConfig,
    ControlConfig,
    DebugConfig,
)
from stormwatch.trainer.config.run import PP_SCHEDULES, TrainConfig

__all__ = [
    "CHECKPOINT_MODES",
    "DEFAULT_CORPUS_MAX_BYTES",
    "DEFAULT_LOG_EVERY",
    "PP_SCHEDULES",
    "SEED_LIMIT",
    "VOCAB_SIZE",
    "CheckpointConfig",
    "ControlConfig",
    "DataConfig",
    "DebugConfig",
    "EvalConfig",
    "ModelConfig",
    "OptimConfig",
    "ProgressConfig",
    "TelemetryConfig",
    "TracingConfig",
    "TrainConfig",
    "check_otlp_available",
]
