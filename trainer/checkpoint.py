"""Distributed checkpoints (``torch.distributed.checkpoint``) that survive a crash mid-save.

What is saved (one DCP state dict; nested keys are flattened by DCP):

* ``model``, ``optim``: from :func:`~torch.distributed.checkpoint.state_dict.get_state_dict`
  (sharded DTensors; DCP re-shards on load, so other degrees can resume);
* ``train``: ``step``, ``world_size``, ``dp``, ``tp`` (same on every rank);
* ``ranks.<R>``: this rank's ``rng_cpu`` (torch CPU generator state),
  ``rng_cuda`` (when CUDA is in use) and ``sampler`` (data-sampler state).
  Each rank writes and reads only its own key.

Save protocol (FC-11): rank 0 picks a fresh per-attempt temporary folder and
broadcasts it; every rank writes its shards with ``dcp.save`` (which returns
after rank 0 has written ``.metadata``); a barrier makes sure every rank has
finished; rank 0 writes the completion marker (step + file list), renames the
folder atomically to ``step-XXXXXXXX``, prunes old checkpoints (keeping the
newest ``keep``) and broadcasts the outcome, so all ranks succeed or raise
together. Resume: rank 0 scans the folder, warns about every partial
checkpoint it skips, picks the latest complete one and broadcasts the choice;
then every rank loads it. No rank ever acts on a filesystem check of its own.
Layout helpers: :mod:`stormwatch.trainer.checkpoint_store`.

Bitwise resume: model, optimizer, step, sampler and RNG states are restored
exactly, and the batch of a step depends only on ``(seed, step, dp_rank)``,
so a resumed CPU run reproduces the uninterrupted run's losses bit for bit.
When the world size or degrees differ from the checkpoint's, model and
optimizer are re-sharded but the per-rank RNG/sampler state cannot be
mapped; it is re-derived from ``(seed, step, dp_rank)`` with a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from stormwatch.trainer import checkpoint_store as store
from stormwatch.trainer.config import CheckpointConfig
from stormwatch.trainer.data import BatchSampler, derive_seed
from stormwatch.trainer.errors import CheckpointError
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RankLayout:
    """Where this rank sits in the job (what a checkpoint's per-rank state depends on)."""

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


class Checkpointer:
    """Saves every ``config.every`` steps and resumes from the latest complete checkpoint.

    Args:
        config: folder, interval, how many to keep; ``directory=None`` disables it.
        state: the objects to save and restore.
        layout: this rank's position (rank, degrees, attempt).

    All public methods are collective: every rank must call them in the same order.
    """

    def __init__(self, config: CheckpointConfig, *, state: TrainState, layout: RankLayout) -> None:
        self._config = config
        self._state = state
        self._layout = layout

    @property
    def enabled(self) -> bool:
        """True when a checkpoint folder is configured."""
        return self._config.directory is not None

    def due(self, step: int) -> bool:
        """True when ``step`` (>= 1) should be followed by a save."""
        return self.enabled and step % self._config.every == 0

    # ----------------------------------------------------------------- save
    def save(self, step: int) -> bool:
        """Save the state after ``step``; collective.

        Returns:
            True if a new checkpoint was committed, False if one for ``step``
            was already complete (nothing written) or checkpointing is disabled.

        Raises:
            CheckpointError: on every rank, if any part of the save failed.
        """
        if not self.enabled:
            return False
        tmp_name = self._agree(lambda: self._plan_save(step))
        if tmp_name is None:
            log.info("checkpoint of step %d already complete; not saving again", step)
            return False
        tmp_dir = Path(tmp_name)
        try:
            dcp.save(self._capture(step), checkpoint_id=tmp_dir)
        except Exception as exc:
            raise CheckpointError(f"saving step {step} into {tmp_dir} failed: {exc}") from exc
        self._barrier()  # every rank has finished writing its shards
        final = self._agree(lambda: self._commit(step, tmp_dir))
        log.info("checkpoint of step %d complete: %s", step, final)
        return True

    def _plan_save(self, step: int) -> str | None:
        root = self._root()
        root.mkdir(parents=True, exist_ok=True)
        final = root / store.step_dir_name(step)
        if final.exists() and store.incomplete_reason(final) is None:
            return None
        tmp_dir = root / store.tmp_dir_name(step, attempt=self._layout.attempt)
        tmp_dir.mkdir()
        return str(tmp_dir)

    def _commit(self, step: int, tmp_dir: Path) -> str:
        if not (tmp_dir / store.METADATA_NAME).is_file():
            raise CheckpointError(f"{tmp_dir} has no {store.METADATA_NAME} after dcp.save")
        files = sorted(p.name for p in tmp_dir.iterdir() if p.is_file())
        layout = self._layout
        marker = store.CompletionMarker(
            step=step,
            files=files,
            world_size=layout.world_size,
            dp=layout.dp,
            tp=layout.tp,
            attempt=layout.attempt,
            time=time.time(),
        )
        store.write_marker(tmp_dir, marker)
        final = store.commit(tmp_dir, step)
        # Prune only now: "latest" has moved and is durable (FC-11).
        for removed in store.prune(self._root(), keep=self._config.keep):
            log.info("removed old or partial checkpoint %s", removed)
        return str(final)

    def _capture(self, step: int) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self._state.model, self._state.optimizer)
        layout = self._layout
        return {
            "model": model_sd,
            "optim": optim_sd,
            "train": {
                "step": step,
                "world_size": layout.world_size,
                "dp": layout.dp,
                "tp": layout.tp,
            },
            "ranks": {
                str(layout.rank): {**_rng_state(), "sampler": self._state.sampler.state_dict()}
            },
        }

    # --------------------------------------------------------------- resume
    def load_latest(self) -> int | None:
        """Restore the latest complete checkpoint; collective.

        Partial checkpoints are skipped with a warning (rank 0 logs them).

        Returns:
            The restored step, or ``None`` when there is nothing to resume
            (checkpointing disabled, empty folder).

        Raises:
            CheckpointError: on every rank, if the chosen checkpoint cannot be loaded.
        """
        if not self.enabled:
            return None
        choice = self._agree(self._choose_latest)
        if choice is None:
            return None
        step, path_name, same_layout = choice
        path = Path(path_name)
        template = self._capture(step)
        if not same_layout:
            del template["ranks"]
        try:
            dcp.load(template, checkpoint_id=path)
            set_state_dict(
                self._state.model,
                self._state.optimizer,
                model_state_dict=template["model"],
                optim_state_dict=template["optim"],
            )
        except Exception as exc:
            raise CheckpointError(f"loading {path} failed: {exc}") from exc
        if template["train"]["step"] != step:
            raise CheckpointError(
                f"{path}: state says step {template['train']['step']}, marker says {step}"
            )
        if same_layout:
            mine = template["ranks"][str(self._layout.rank)]
            self._state.sampler.load_state_dict(mine["sampler"])
            # Restore RNG last: nothing after this point may draw random numbers.
            torch.set_rng_state(mine["rng_cpu"])
            if "rng_cuda" in mine:
                torch.cuda.set_rng_state(mine["rng_cuda"])
        else:
            self._state.sampler.next_step = step + 1
            torch.manual_seed(derive_seed("dropout", self._state.seed, self._layout.dp_rank, step))
        log.info("resumed from %s (step %d)", path, step)
        return step

    def _choose_latest(self) -> tuple[int, str, bool] | None:
        found = store.scan(self._root())
        for partial in found.partial:
            log.warning("skipping partial checkpoint %s: %s", partial.path, partial.reason)
        latest = found.latest
        if latest is None:
            return None
        layout = self._layout
        marker = latest.marker
        same = (marker.world_size, marker.dp, marker.tp) == (
            layout.world_size,
            layout.dp,
            layout.tp,
        )
        if not same:
            log.warning(
                "checkpoint %s was written by world_size=%d dp=%d tp=%d, this run has "
                "world_size=%d dp=%d tp=%d: model and optimizer are re-sharded, RNG and "
                "sampler state are re-derived from the seed (losses will not match bitwise)",
                latest.path,
                marker.world_size,
                marker.dp,
                marker.tp,
                layout.world_size,
                layout.dp,
                layout.tp,
            )
        return latest.step, str(latest.path), same

    # ----------------------------------------------------------- agreement
    def _root(self) -> Path:
        assert self._config.directory is not None
        return self._config.directory

    def _agree(self, decide: Callable[[], T]) -> T:
        """Run ``decide`` on rank 0 only and give every rank its result (or its error)."""
        box: list[Any] = [None]
        if self._layout.rank == 0:
            try:
                box[0] = ("ok", decide())
            except Exception as exc:
                log.error("checkpoint decision failed on rank 0", exc_info=True)
                box[0] = ("error", f"{type(exc).__name__}: {exc}")
        if self._layout.world_size > 1:
            dist.broadcast_object_list(box, src=0)
        status, value = box[0]
        if status == "error":
            raise CheckpointError(f"rank 0: {value}")
        return value

    def _barrier(self) -> None:
        if self._layout.world_size > 1:
            dist.barrier()


__all__ = ["Checkpointer", "RankLayout", "TrainState"]
