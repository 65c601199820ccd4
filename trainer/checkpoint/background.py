"""Async saves: the training thread hands over references, a writer thread does the rest.

On the training thread (:meth:`BackgroundSaver.start`) a save costs the state-dict
capture (references to the live tensors, :meth:`SavedState.capture
<stormwatch.trainer.checkpoint.state.SavedState.capture>`) and a hand-over. Then:

* **staging** (DCP's :class:`~torch.distributed.checkpoint.staging.DefaultStager`
  on its own thread): every tensor is copied with ``copy_`` into a CPU buffer kept
  from the previous save (one per source storage, allocated at the first save;
  pinned, with a non-blocking copy on a side stream, when an accelerator is
  there). The live tensors must not change until the copy is done: the loop
  calls :meth:`InFlight.wait_for_copy` before its next optimizer step, which on
  this project's CPU benchmark finds the copy long finished (it overlaps the next
  forward and backward passes);
* **writing and committing** (a writer thread of the checkpointer, over its own gloo
  group, so its collectives never interleave with training's): the ranks check that
  every copy succeeded, then run :class:`~stormwatch.trainer.checkpoint.protocol.SaveProtocol`:
  folder agreed, ``dcp.save`` with a save planner that caches its plans
  (``DefaultSavePlanner(enable_plan_caching=True)``: from the second save on, the ranks
  exchange empty plans and the coordinator reuses the global plan and metadata),
  shard checksums gathered, marker, rename and prune on rank 0.

So "latest" moves as soon as every rank has written (FC-11: the commit follows the
gather of every rank's outcome, a barrier); the training thread learns of it at the
next step's vote (:meth:`Checkpointer.write_finished
<stormwatch.trainer.checkpoint.checkpointer.Checkpointer.write_finished>`) and only
records it.
"""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from stormwatch.trainer.checkpoint.budget import DCP_ERRORS, describe_dcp_error
from stormwatch.trainer.checkpoint.protocol import SaveProtocol
from stormwatch.trainer.errors import CheckpointError

log = logging.getLogger(__name__)

#: SavePlanner's class-level plan caches, all keyed by the planner's ``_cached_plans_key``.
_PLAN_CACHES = (
    "_cached_save_plan",
    "_cached_final_save_plan",
    "_cached_all_plans",
    "_cached_global_plan",
    "_cached_metadata",
)


class _CachingPlanner(DefaultSavePlanner):
    """DCP's default save planner with plan caching, keyed per checkpointer.

    DCP keys its cache by the planner's class name, one cache per process: two
    checkpointers of other state dicts or world sizes in one process (tests, the
    benchmark's trials) would merge each other's plans. A key of its own avoids it.
    """

    def __init__(self) -> None:
        super().__init__(enable_plan_caching=True)
        self._cached_plans_key = f"stormwatch-checkpoint-{uuid.uuid4().hex}"

    def forget(self) -> None:
        """Drop this planner's entries from DCP's class-level caches."""
        for name in _PLAN_CACHES:
            getattr(SavePlanner, name).pop(self._cached_plans_key, None)


@dataclass
class InFlight:
    """An async save handed to the background.

    Attributes:
        step: the step saved.
        copied: resolves when this rank's state is copied into the staging buffers
            (the live tensors may change from then on).
        done: resolves when the save is committed on every rank, to the final folder
            (``None``: a sound checkpoint of ``step`` existed already); raises
            :class:`CheckpointError` (on every rank alike) if it failed.
    """

    step: int
    copied: Future[Any]
    done: Future[Path | None]

    def wait_for_copy(self) -> None:
        """Block until the staging copy has ended (its error, if any, surfaces in ``done``)."""
        wait([self.copied])


class BackgroundSaver:
    """Stages, writes and commits async saves off the training thread.

    Args:
        protocol: the save's collective steps over the checkpointer's own group.
        accelerator: the state is on an accelerator (GPU): stage into pinned memory with
            non-blocking copies on a side stream (DCP's non-blocking copy requires one).

    One save at a time: the caller waits for ``done`` before the next :meth:`start`
    (the next copy overwrites the staging buffers).
    """

    def __init__(self, protocol: SaveProtocol, *, accelerator: bool) -> None:
        self._protocol = protocol
        self._accelerator = accelerator
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=accelerator,
                use_shared_memory=False,  # the writer is a thread of this process
                use_async_staging=True,
                use_non_blocking_copy=accelerator,
            )
        )
        self._planner = _CachingPlanner()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")

    def start(self, step: int, captured: dict[str, Any]) -> InFlight:
        """Hand the state of ``step`` (``captured``: references to the live tensors) over.

        Not collective on the training thread; the writer thread's steps are collective
        over the protocol's group, in the order of the calls.
        """
        copied: Future[Any]
        if self._accelerator:
            # DCP's side-stream copy does not wait for the compute stream: the step's
            # optimizer kernels must have run (the loop's loss read has waited for them
            # already, so this costs nothing there).
            torch.accelerator.synchronize()
        try:
            staged = self._stager.stage(captured)
        except DCP_ERRORS as exc:  # not even handed to the staging thread
            copied = Future()
            copied.set_exception(exc)
        else:
            if isinstance(staged, Future):
                copied = staged
            else:  # DefaultStager returns a Future when staging is async
                copied = Future()
                copied.set_result(staged)
        done = self._writer.submit(self._save, step, copied)
        return InFlight(step, copied, done)

    def close(self) -> None:
        """Release the writer thread, the staging buffers and the cached plan. A save still
        in flight (a stop cut training short) is left to end on its thread: collectives
        cannot be cancelled."""
        self._writer.shutdown(wait=False, cancel_futures=True)
        self._stager.close()
        self._planner.forget()

    def _save(self, step: int, copied: Future[Any]) -> Path | None:
        """The writer thread's part of a save (every rank runs it; collective)."""
        protocol = self._protocol
        try:
            staged, error = copied.result(), None
        except DCP_ERRORS as exc:
            staged, error = None, f"copying the state: {describe_dcp_error(exc)}"
        errors = [f"rank {r}: {e}" for r, e in enumerate(protocol.gather(error)) if e is not None]
        if errors or staged is None:
            raise CheckpointError(f"saving step {step} failed: {'; '.join(errors)}")
        tmp_dir = protocol.open(step)
        if tmp_dir is None:
            log.info("checkpoint of step %d already complete; not saving again", step)
            return None
        write_error = None
        try:
            protocol.write(staged, tmp_dir, step, planner=self._planner)
        except DCP_ERRORS as exc:
            write_error = describe_dcp_error(exc, ranks=False)  # commit() names the rank
        return protocol.commit(step, tmp_dir, protocol.outcomes(tmp_dir, write_error))


__all__ = ["BackgroundSaver", "InFlight"]
