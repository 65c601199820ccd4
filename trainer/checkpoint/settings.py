"""Which run settings a resume may change, checked against the checkpoint's marker.

Each save records the run's settings in its marker (``settings``, by option:
``{"--d-model": 64, ...}``, :class:`~stormwatch.trainer.checkpoint.store.CompletionMarker`).
On resume, rank 0 compares them with this run's before anything is loaded:

* **must match** (:data:`MUST_MATCH`): the model's shape (``--d-model``, ``--n-heads``,
  ``--n-layers``, and ``--seq-len``, which sizes the position table) and what decides
  which samples a step trains on (``--seed``). Weights of another shape cannot be loaded
  (or, for ``--n-heads``, load into another attention layout without an error), and another
  seed trains on other data: refused with :class:`~stormwatch.trainer.errors.ResumeRefused`,
  naming the option, both values and the fix.
* **global batch** (``--global-batch``, recorded as the effective sequences per step): must
  match when the run has the checkpoint's layout (it changes which samples step ``s`` holds);
  after an elastic resize (another world size or dp) a different one is allowed with a
  warning (:meth:`~stormwatch.trainer.checkpoint.state.SavedState.restore_rank`), since
  ``micro-batch x dp`` is its default.
* **may change, with a warning** (:data:`MAY_CHANGE`): ``--micro-batch`` (the same samples
  per step, split into other micro-batches: sums and dropout masks differ, so the resume is
  no longer bitwise) and ``--dropout`` (a regularisation setting; no state depends on it).
* Parallel degrees and world size may change (DCP re-shards; the checkpointer warns), and
  so may everything else (learning rate, intervals, telemetry).

Markers written before settings were recorded have none: nothing is compared (the data
sampler still refuses another seed or sequence length when it is loaded).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from stormwatch.trainer.config import TrainConfig
from stormwatch.trainer.errors import ResumeRefused

#: Settings a resume must keep.
MUST_MATCH = ("--d-model", "--n-heads", "--n-layers", "--seq-len", "--seed")
#: Settings a resume may change (with a warning).
MAY_CHANGE = ("--micro-batch", "--dropout")
#: Kept unless the layout changes (elastic resize), see the module docstring.
GLOBAL_BATCH = "--global-batch"

Settings = Mapping[str, int | float | str]

#: What a refused setting decides (named in the refusal).
_MEANS = {
    "--d-model": "the model's shape",
    "--n-heads": "the attention layout",
    "--n-layers": "the model's shape",
    "--seq-len": "the position table and the samples",
    "--seed": "the data order",
    GLOBAL_BATCH: "the samples each step trains on",
}


def run_settings(config: TrainConfig, *, global_batch: int) -> dict[str, int | float | str]:
    """This run's settings as a marker records them.

    Args:
        config: the run's config.
        global_batch: the effective sequences per step (the sampler's).
    """
    return {
        "--d-model": config.model.d_model,
        "--n-heads": config.model.n_heads,
        "--n-layers": config.model.n_layers,
        "--seq-len": config.data.seq_len,
        "--seed": config.data.seed,
        "--micro-batch": config.data.micro_batch,
        "--dropout": config.model.dropout,
        GLOBAL_BATCH: global_batch,
    }


def check_resume(saved: Settings, mine: Settings, *, origin: Path, same_layout: bool) -> list[str]:
    """Compare a checkpoint's settings with this run's.

    Args:
        saved: the marker's settings (empty: an older marker, nothing compared).
        mine: this run's (:func:`run_settings`).
        origin: the checkpoint folder (named in the messages).
        same_layout: the run has the checkpoint's world size and degrees.

    Returns:
        A warning per allowed change.

    Raises:
        ResumeRefused: a setting that must match differs (every such one is named).
    """
    must = MUST_MATCH + ((GLOBAL_BATCH,) if same_layout else ())
    differ = [name for name in must if name in saved and saved[name] != mine.get(name)]
    if differ:
        changes = ", ".join(
            f"{name} {saved[name]} where this run has {mine.get(name)} ({_MEANS[name]})"
            for name in differ
        )
        again = " ".join(f"{name} {saved[name]}" for name in differ)
        raise ResumeRefused(
            f"checkpoint {origin} was written with {changes}; resume with {again}, or use a "
            "new --checkpoint-dir to start a new run"
        )
    return [
        f"checkpoint {origin} was written with {name} {saved[name]}, this run uses "
        f"{mine.get(name)} (allowed: training continues with the new value; the resume is "
        "not bitwise)"
        for name in MAY_CHANGE
        if name in saved and saved[name] != mine.get(name)
    ]


__all__ = ["GLOBAL_BATCH", "MAY_CHANGE", "MUST_MATCH", "Settings", "check_resume", "run_settings"]
