"""What a checkpoint holds, and how a rank's training state is put back from it.

One DCP state dict (nested keys are flattened by DCP):

* ``model``, ``optim``: from :func:`~torch.distributed.checkpoint.state_dict.get_state_dict`
  with ``flatten_optimizer_state_dict=True`` (optimizer state *and* param-group
  settings keyed by parameter FQN, as torchtitan does, so that pipeline
  stages, each holding other parameters, never write the same key)
  (sharded DTensors; DCP re-shards on load, so other degrees can resume);
* ``train``: ``step``, ``world_size``, ``dp``, ``tp`` (same on every rank) and
  ``sampler`` (the data sampler's state, the same on every rank and at every dp);
* ``ranks.<R>``: this rank's ``rng_cpu`` (torch CPU generator state),
  ``rng_cuda`` (when CUDA is in use) and ``sampler`` (data-sampler state).
  Each rank writes and reads only its own key.

Bitwise resume: model, optimizer, step, sampler and RNG states are restored
exactly, and the batch of a step depends only on ``(seed, step, dp_rank)``,
so a resumed CPU run reproduces the uninterrupted run's losses bit for bit.
When the world size or degrees differ from the checkpoint's, model and
optimizer are re-sharded but the per-rank RNG/sampler state cannot be
mapped; it is re-derived from ``(seed, step, dp_rank)`` with a warning.
The sampler's state does not depend on the layout (samples are indexed
globally, :mod:`stormwatch.trainer.data.batches`), so it is restored from
``train.sampler`` after a resize (elastic restart at another ``dp``); a
different global batch is allowed with a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from stormwatch.trainer.data.batches import BatchSampler, derive_seed

log = logging.getLogger(__name__)

#: Optimizer state keyed by parameter FQN ("optim.state.layers.1.mlp.w1.weight.exp_avg",
#: "optim.param_groups.layers.1.mlp.w1.weight.lr"), not by list index: with pipeline
#: parallelism each stage's optimizer holds other parameters, and index-keyed param
#: groups ("optim.param_groups.0.params") would collide across stages.
_STATE_DICT_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


@dataclass(frozen=True, kw_only=True)
class RankLayout:
    """Where this rank sits in the job (what a checkpoint's per-rank state depends on).

    ``dp`` is the data-parallel degree the data sees (``dp_replicate x
    dp_shard``) and ``dp_rank`` this rank's index in it. ``pp`` is implied:
    ``world_size / (dp x tp)``, so equal ``(world_size, dp, tp)`` mean the
    same rank -> batch mapping (HSDP and FSDP2 of the same ``dp`` differ only
    in how parameters are sharded, which DCP re-shards).
    """

    rank: int
    world_size: int
    dp: int
    tp: int
    dp_rank: int
    attempt: int


@dataclass
class TrainState:
    """Everything a checkpoint restores, by reference (the loop keeps using the same objects).

    Attributes:
        model: the parallelized model.
        optimizer: its optimizer.
        sampler: the batch sampler.
        seed: run seed (to re-derive RNG state when per-rank state cannot be restored).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    sampler: BatchSampler
    seed: int


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"rng_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["rng_cuda"] = torch.cuda.get_rng_state()
    return state


class SavedState:
    """This rank's state dict for DCP, and its restoration after ``dcp.load``.

    Args:
        state: the objects saved and restored (by reference).
        layout: this rank's position (what the per-rank part depends on).
    """

    def __init__(self, state: TrainState, layout: RankLayout) -> None:
        self._state = state
        self._layout = layout

    def capture(self, step: int) -> dict[str, Any]:
        """The state dict of ``step`` to save (sharded tensors are references, not copies)."""
        model_sd, optim_sd = get_state_dict(
            self._state.model, self._state.optimizer, options=_STATE_DICT_OPTIONS
        )
        layout = self._layout
        return {
            "model": model_sd,
            "optim": optim_sd,
            "train": {
                "step": step,
                "world_size": layout.world_size,
                "dp": layout.dp,
                "tp": layout.tp,
                # The same on every rank and at every dp (trainer/data/batches.py): restored on resize too.
                "sampler": self._state.sampler.state_dict(),
            },
            "ranks": {
                str(layout.rank): {**_rng_state(), "sampler": self._state.sampler.state_dict()}
            },
        }

    def template(self, step: int, *, same_layout: bool) -> dict[str, Any]:
        """What ``dcp.load`` fills in place: :meth:`capture`'s keys, without ``ranks`` after a resize."""
        template = self.capture(step)
        if not same_layout:
            del template["ranks"]
        return template

    def restore_model(self, loaded: dict[str, Any]) -> None:
        """Put the loaded model and optimizer state in place (DCP errors propagate)."""
        set_state_dict(
            self._state.model,
            self._state.optimizer,
            model_state_dict=loaded["model"],
            optim_state_dict=loaded["optim"],
            options=_STATE_DICT_OPTIONS,
        )

    def restore_rank(self, loaded: dict[str, Any], *, step: int, origin: Path) -> None:
        """Restore the sampler and RNG: this rank's own (same layout) or re-derived (resize).

        Args:
            loaded: the template after ``dcp.load`` (with ``ranks`` only for the same layout).
            step: the checkpoint's step (the dropout seed after a resize depends on it).
            origin: the checkpoint folder (named in the warning about a changed global batch).
        """
        sampler = self._state.sampler
        if "ranks" in loaded:
            mine = loaded["ranks"][str(self._layout.rank)]
            sampler.load_state_dict(mine["sampler"])
            # Restore RNG last: nothing after this point may draw random numbers.
            torch.set_rng_state(mine["rng_cpu"])
            if "rng_cuda" in mine:
                torch.cuda.set_rng_state(mine["rng_cuda"])
            return
        saved = loaded["train"]["sampler"]
        sampler.load_state_dict(saved)
        if saved.get("global_batch") != sampler.global_batch:
            log.warning(
                "checkpoint %s was trained with a global batch of %s sequences, this run "
                "uses %d: the optimisation changes (pass --global-batch %s to keep it)",
                origin,
                saved.get("global_batch"),
                sampler.global_batch,
                saved.get("global_batch"),
            )
        torch.manual_seed(derive_seed("dropout", self._state.seed, self._layout.dp_rank, step))


__all__ = ["RankLayout", "SavedState", "TrainState"]
