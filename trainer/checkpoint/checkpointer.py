"""Distributed checkpoints (``torch.distributed.checkpoint``) that survive a crash mid-save.

What is saved and how it is restored (bitwise, or re-derived after a resize):
:mod:`stormwatch.trainer.checkpoint.state`.

Save protocol (FC-11), :mod:`stormwatch.trainer.checkpoint.protocol`: rank 0 picks a
fresh per-attempt temporary folder and broadcasts it; every rank writes its shards
with ``dcp.save``; every rank checksums its shard files and the outcomes are gathered
(a barrier); rank 0 writes the completion marker (step, file list, CRC-32 checksums),
renames the folder atomically to ``step-XXXXXXXX``, prunes old checkpoints (keeping
the newest ``keep``) and broadcasts the outcome, so all ranks succeed or raise
together. Resume: rank 0 scans the folder, warns about every partial checkpoint it
skips, picks the latest complete one whose files match the checksums in its marker
(a corrupt one is skipped with a warning naming the file), checks that this run's
settings may resume it (:mod:`stormwatch.trainer.checkpoint.settings`) and broadcasts
the choice; then every rank loads it. Final-named folders it skipped (partial or
corrupt) are set aside, never deleted (:func:`~stormwatch.trainer.checkpoint.store.set_aside`);
when the folder holds such folders and no usable checkpoint at all, resume is refused
(:class:`~stormwatch.trainer.errors.ResumeRefused`) instead of starting over beside
them. No rank ever acts on a filesystem check of its own.
Layout helpers: :mod:`stormwatch.trainer.checkpoint.store`.

Sync mode (``mode="sync"``): the whole protocol on the training thread.

Async mode (``mode="async"``), :mod:`stormwatch.trainer.checkpoint.background`: the
training thread captures the state dict (references) and hands it over; DCP's stager
copies it into CPU buffers reused from save to save, and a writer thread runs the
whole protocol (folder, ``dcp.save`` with cached plans, checksums, marker, rename)
over a dedicated gloo process group, so its collectives never interleave with
training's. Training continues; before its next optimizer step the loop waits for
the copy (:meth:`Checkpointer.wait_for_copy`), so a save holds the values of its own
step. Each step every rank reports whether its save has ended (a vote packed into
the gradient-norm all-reduce, no extra collective); when all have, :meth:`finish`
records the commit (or raises the failure every rank agreed on). A new save, and the
end of training, first wait for the pending one. A crash at any point before the
marker leaves a partial folder that resume skips.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from stormwatch.telemetry import lost_peer, rank_failures
from stormwatch.trainer.checkpoint import store
from stormwatch.trainer.checkpoint.background import BackgroundSaver, InFlight
from stormwatch.trainer.checkpoint.budget import DCP_ERRORS, describe_dcp_error
from stormwatch.trainer.checkpoint.protocol import FaultHook, SaveProtocol
from stormwatch.trainer.checkpoint.settings import check_resume
from stormwatch.trainer.checkpoint.state import RankLayout, SavedState, TrainState
from stormwatch.trainer.config import CheckpointConfig
from stormwatch.trainer.errors import CheckpointError, ResumeRefused, Terminated

log = logging.getLogger(__name__)


def _reraise_job_failure(exc: BaseException) -> None:
    """Raise what ends the job rather than fails the save, if ``exc`` is or wraps one (DCP
    wraps every rank's failure in a ``CheckpointException``); else return, and the caller
    counts a failed save.

    * A stop request (:class:`Terminated`: SIGTERM while a save ran). Counting it fired
      StormwatchCheckpointFailing for 15 minutes after a planned restart (the 30-minute
      soak, 2026-12-05).
    * A lost peer (:func:`~stormwatch.telemetry.failures.lost_peer`: a rank died or
      left mid-save). The process group is broken: the job fails here as it would at its
      next collective. Counting it fired the same alert after an elastic resize (the soak's
      end-to-end test, 2026-12-06: node1 left during a save).

    The partial folder is left for the next start to prune, as a crash's is."""
    for _rank, inner in rank_failures(exc):
        if isinstance(inner, Terminated):
            if inner is exc:
                raise exc
            raise inner from exc
    peer = lost_peer(exc)
    if peer is exc:
        raise exc
    if peer is not None:
        raise peer from exc


class Checkpointer:
    """Saves every ``config.every`` steps and resumes from the latest complete checkpoint.

    Args:
        config: folder, interval, how many to keep; ``directory=None`` disables it.
        state: the objects to save and restore.
        layout: this rank's position (rank, degrees, attempt).
        on_commit: ``on_commit(step)`` on the training thread once a save is committed.
        fault_hook: called at each phase of a save (:data:`FaultHook`).
        group_timeout: collective timeout of the async mode's own gloo group (the job's
            ``--collective-timeout``; ``None``: torch's default, 30 minutes, which a
            save with a frozen peer would wait for).
        settings: this run's settings, recorded in each marker and compared on resume
            (:func:`stormwatch.trainer.checkpoint.settings.run_settings`; empty: none).

    All public methods but :meth:`wait_for_copy`, :meth:`write_finished` and
    :meth:`close` are collective: every rank must call them in the same order.
    """

    def __init__(
        self,
        config: CheckpointConfig,
        *,
        state: TrainState,
        layout: RankLayout,
        on_commit: Callable[[int], None] | None = None,
        fault_hook: FaultHook | None = None,
        group_timeout: timedelta | None = None,
        settings: dict[str, int | float | str] | None = None,
    ) -> None:
        self._config = config
        self._settings = dict(settings or {})
        self._state = SavedState(state, layout)
        self._layout = layout
        self._on_commit = on_commit
        self._pending: InFlight | None = None
        root = config.directory or Path()
        self._sync = SaveProtocol(
            root, keep=config.keep, layout=layout, hook=fault_hook, settings=self._settings
        )
        self._background: BackgroundSaver | None = None
        if self.enabled and config.mode == "async":
            # The writer thread runs collectives: give it its own group.
            group = (
                dist.new_group(backend="gloo", timeout=group_timeout, group_desc="checkpoint_async")
                if layout.world_size > 1
                else None
            )
            self._background = BackgroundSaver(
                SaveProtocol(
                    root,
                    keep=config.keep,
                    layout=layout,
                    hook=fault_hook,
                    group=group,
                    settings=self._settings,
                ),
                accelerator=any(p.device.type != "cpu" for p in state.model.parameters()),
            )

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

        Async mode: hands the state over and returns False at once; the save is
        committed in the background and recorded by :meth:`finish`.

        Returns:
            True if a new checkpoint was committed, False if one for ``step``
            was already complete (nothing written), the save runs in the background,
            or checkpointing is disabled.

        Raises:
            CheckpointError: on every rank, if any part of the save failed (async:
                the previous save's failure, from :meth:`finish`).
        """
        if not self.enabled:
            return False
        self.finish()  # async: at most one save in flight (it owns the staging buffers)
        if self._background is not None:
            self._pending = self._background.start(step, self._state.capture(step))
            return False
        tmp_dir = self._sync.open(step)
        if tmp_dir is None:
            log.info("checkpoint of step %d already complete; not saving again", step)
            return False
        try:
            self._sync.write(self._state.capture(step), tmp_dir, step)
        except DCP_ERRORS as exc:
            _reraise_job_failure(exc)  # the partial folder is pruned at the next start
            self._sync.discard(tmp_dir)  # every rank is past its writes: DCP gathered the failure
            raise CheckpointError(
                f"saving step {step} into {tmp_dir} failed: {describe_dcp_error(exc)}"
            ) from exc
        # Every rank has finished writing its shards (all_gather is a barrier).
        final = self._sync.commit(step, tmp_dir, self._sync.outcomes(tmp_dir, None))
        self._committed(step, final)
        return True

    @property
    def pending_step(self) -> int | None:
        """Step of the async save in flight, if any."""
        return None if self._pending is None else self._pending.step

    def copy_pending(self) -> bool:
        """True while the async save in flight still copies the live state (not collective)."""
        return self._pending is not None and not self._pending.copied.done()

    def wait_for_copy(self) -> None:
        """Block until the async save in flight has copied the live state (not collective).

        Call before anything changes the saved tensors in place (the optimizer step);
        a no-op when nothing is in flight or the copy is done.
        """
        if self._pending is not None:
            self._pending.wait_for_copy()

    def write_finished(self) -> bool:
        """True when this rank's async save has ended (committed or failed; not collective)."""
        return self._pending is not None and self._pending.done.done()

    def finish(self) -> int | None:
        """Wait for the async save in flight (if any) and record its commit; collective.

        Returns:
            The committed step, or ``None`` when nothing was in flight or nothing
            needed writing.

        Raises:
            CheckpointError: on every rank, if any rank's save failed.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            final = pending.done.result()
        except CheckpointError:
            raise
        except DCP_ERRORS as exc:  # the writer thread's own bug, not an agreed outcome
            _reraise_job_failure(exc)
            raise CheckpointError(
                f"saving step {pending.step} failed: {describe_dcp_error(exc)}"
            ) from exc
        if final is None:
            return None
        self._committed(pending.step, final)
        return pending.step

    def close(self) -> None:
        """Release the async mode's writer thread, staging buffers and cached save plan
        (not collective). A save still in flight is left to end on its thread."""
        if self._background is not None:
            self._background.close()

    def _committed(self, step: int, final: Path) -> None:
        log.info("checkpoint of step %d complete: %s", step, final)
        if self._on_commit is not None:
            self._on_commit(step)

    # --------------------------------------------------------------- resume
    def load_latest(self) -> int | None:
        """Restore the latest complete checkpoint; collective.

        Partial checkpoints are skipped with a warning (rank 0 logs them).

        Returns:
            The restored step, or ``None`` when there is nothing to resume
            (checkpointing disabled, empty folder).

        Raises:
            ResumeRefused: on every rank, if the folder holds damaged checkpoints and no
                usable one, or the latest was written with settings this run may not change.
            CheckpointError: on every rank, if the chosen checkpoint cannot be loaded.
        """
        if not self.enabled:
            return None
        choice = self._sync.agree(self._choose_latest)
        if choice is None:
            return None
        step, path_name, same_layout = choice
        path = Path(path_name)
        loaded = self._state.template(step, same_layout=same_layout)
        try:
            dcp.load(loaded, checkpoint_id=path)
            self._state.restore_model(loaded)
        except DCP_ERRORS as exc:
            raise CheckpointError(f"loading {path} failed: {describe_dcp_error(exc)}") from exc
        if loaded["train"]["step"] != step:
            raise CheckpointError(
                f"{path}: state says step {loaded['train']['step']}, marker says {step}"
            )
        self._state.restore_rank(loaded, step=step, origin=path)
        log.info("resumed from %s (step %d)", path, step)
        return step

    def _choose_latest(self) -> tuple[int, str, bool] | None:
        found = store.scan(self._sync.root)
        damaged = [(p.path, p.reason) for p in found.partial if p.final]
        for partial in found.partial:
            log.warning("skipping partial checkpoint %s: %s", partial.path, partial.reason)
        latest = None
        for candidate in reversed(found.complete):  # newest first
            corrupt = store.checksum_mismatch(candidate)
            if corrupt is None:
                latest = candidate
                break
            log.warning("skipping corrupt checkpoint %s: %s", candidate.path, corrupt)
            damaged.append((candidate.path, corrupt))
        if latest is None:
            if damaged:
                raise ResumeRefused(_nothing_usable(self._sync.root, damaged))
            return None
        layout = self._layout
        marker = latest.marker
        same = (marker.world_size, marker.dp, marker.tp) == (
            layout.world_size,
            layout.dp,
            layout.tp,
        )
        for warning in check_resume(
            marker.settings, self._settings, origin=latest.path, same_layout=same
        ):
            log.warning("%s", warning)
        for path, reason in damaged:  # kept, out of the way of saves and prunes
            store.set_aside(path, reason)
        if not same:
            log.warning(
                "checkpoint %s was written by world_size=%d dp=%d tp=%d, this run has "
                "world_size=%d dp=%d tp=%d: model and optimizer are re-sharded, the data "
                "sampler continues at the same global sample; per-rank RNG state is re-derived "
                "(dropout is re-seeded per micro-batch anyway)",
                latest.path,
                marker.world_size,
                marker.dp,
                marker.tp,
                layout.world_size,
                layout.dp,
                layout.tp,
            )
        return latest.step, str(latest.path), same


def _nothing_usable(root: Path, damaged: list[tuple[Path, str]]) -> str:
    """The refusal of a folder whose checkpoints are all damaged: each one and why, and
    how to go on (nothing was changed)."""
    listing = "; ".join(f"{path.name}: {reason}" for path, reason in damaged)
    return (
        f"--checkpoint-dir {root} holds no usable checkpoint, only damaged ones ({listing}); "
        "not starting over beside them (nothing was changed). Resume needs a complete "
        "checkpoint: restore one, or start a new run with a new --checkpoint-dir, or move "
        f"the damaged folders out of {root}"
    )


__all__ = ["Checkpointer", "FaultHook"]
