"""Distributed checkpoints (``torch.distributed.checkpoint``) that survive a crash mid-save.

What is saved and how it is restored (bitwise, or re-derived after a resize):
:mod:`stormwatch.trainer.checkpoint.state`.

Save protocol (FC-11): rank 0 picks a fresh per-attempt temporary folder and
broadcasts it; every rank writes its shards with ``dcp.save`` (which returns
after rank 0 has written ``.metadata``); a barrier makes sure every rank has
finished; rank 0 writes the completion marker (step + file list), renames the
folder atomically to ``step-XXXXXXXX``, prunes old checkpoints (keeping the
newest ``keep``) and broadcasts the outcome, so all ranks succeed or raise
together. Resume: rank 0 scans the folder, warns about every partial
checkpoint it skips, picks the latest complete one whose files match the
CRC-32 checksums in its marker (each rank checksums the shard files it wrote,
rank 0 gathers them into the marker; a corrupt one is skipped with a warning
naming the file) and broadcasts the choice;
then every rank loads it. No rank ever acts on a filesystem check of its own.
Layout helpers: :mod:`stormwatch.trainer.checkpoint.store`.

Async mode (``mode="async"``): ``dcp.async_save`` copies the state to CPU
memory (the writer's blocking stager), then writes it in a background thread
over a dedicated gloo process group, so its collectives never interleave
with training's. Training continues. Each step every rank reports whether
its write has finished (a vote packed into the gradient-norm all-reduce, no
extra collective); when all have, every rank gathers the others' outcome and
checksums, and only then does rank 0 write the marker and rename the folder,
so the newest complete checkpoint ("latest") moves only after every rank's
future resolved (FC-11). A new save, and the end of training, first wait for
and commit the pending one. A crash at any point before the marker leaves a
partial folder that resume skips.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from stormwatch.trainer.checkpoint import store
from stormwatch.trainer.checkpoint.budget import DCP_ERRORS, describe_dcp_error
from stormwatch.trainer.checkpoint.state import RankLayout, SavedState, TrainState
from stormwatch.trainer.config import CheckpointConfig
from stormwatch.trainer.errors import CheckpointError, Terminated

log = logging.getLogger(__name__)

T = TypeVar("T")


#: ``hook(phase, step)``: called at each phase of a save (on the writing thread), phases as in
#: :data:`stormwatch.faults.control_file.CHECKPOINT_PHASES` (the ``checkpoint_kill`` fault
#: point of :class:`stormwatch.trainer.control.ControlChannel` is the hook).
FaultHook = Callable[[str, int], None]


def _reraise_stop(exc: BaseException) -> None:
    """Raise the stop request (:class:`Terminated`: SIGTERM while a save ran) that ``exc``
    is or that DCP wrapped (a ``CheckpointException``'s failures); else return. A save cut
    short by a stop is not a failed save: counting it fired StormwatchCheckpointFailing
    for 15 minutes after a planned restart (the 30-minute soak, 2026-12-05), and the
    partial folder is left for the next start to prune, as a crash's is."""
    if isinstance(exc, Terminated):
        raise exc
    failures = getattr(exc, "failures", None)
    for wrapped in failures.values() if isinstance(failures, dict) else ():
        inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        if isinstance(inner, Terminated):
            raise inner from exc


class _Writer(FileSystemWriter):
    """DCP's file-system writer with the ``before_shards`` / ``before_metadata`` hook points."""

    def __init__(self, path: Path, *, step: int, hook: FaultHook | None) -> None:
        super().__init__(path)
        self._step = step
        self._hook = hook

    def write_data(self, plan: Any, planner: Any) -> Any:
        if self._hook is not None:
            self._hook("before_shards", self._step)
        return super().write_data(plan, planner)

    def finish(self, metadata: Any, results: Any) -> None:  # coordinator only: writes .metadata
        if self._hook is not None:
            self._hook("before_metadata", self._step)
        super().finish(metadata, results)


@dataclass
class _Pending:
    step: int
    tmp_dir: Path
    future: Future[Any]


class Checkpointer:
    """Saves every ``config.every`` steps and resumes from the latest complete checkpoint.

    Args:
        config: folder, interval, how many to keep; ``directory=None`` disables it.
        state: the objects to save and restore.
        layout: this rank's position (rank, degrees, attempt).
        group_timeout: collective timeout of the async mode's own gloo group (the job's
            ``--collective-timeout``; ``None``: torch's default, 30 minutes, which a
            save with a frozen peer would wait for).

    All public methods are collective: every rank must call them in the same order.
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
    ) -> None:
        self._config = config
        self._state = SavedState(state, layout)
        self._layout = layout
        self._on_commit = on_commit
        self._hook = fault_hook
        self._pending: _Pending | None = None
        # async_save runs its collectives on a background thread: give it its own group.
        self._group = (
            dist.new_group(backend="gloo", timeout=group_timeout, group_desc="checkpoint_async")
            if self.enabled and config.mode == "async" and layout.world_size > 1
            else None
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

        Returns:
            True if a new checkpoint was committed, False if one for ``step``
            was already complete (nothing written) or checkpointing is disabled.

        Raises:
            CheckpointError: on every rank, if any part of the save failed.
        """
        if not self.enabled:
            return False
        self.finish()  # async: at most one save in flight
        tmp_name = self._agree(lambda: self._plan_save(step))
        if tmp_name is None:
            log.info("checkpoint of step %d already complete; not saving again", step)
            return False
        tmp_dir = Path(tmp_name)
        writer = _Writer(tmp_dir, step=step, hook=self._hook)
        if self._config.mode == "async":
            try:
                future = dcp.async_save(
                    self._state.capture(step),
                    checkpoint_id=tmp_dir,
                    storage_writer=writer,
                    process_group=self._group,
                )
            except DCP_ERRORS as exc:
                _reraise_stop(exc)
                raise CheckpointError(
                    f"starting the save of step {step} failed: {describe_dcp_error(exc)}"
                ) from exc
            self._pending = _Pending(step, tmp_dir, future)  # type: ignore[arg-type]
            return False
        try:
            dcp.save(self._state.capture(step), checkpoint_id=tmp_dir, storage_writer=writer)
        except DCP_ERRORS as exc:
            _reraise_stop(exc)  # the partial folder is pruned at the next start
            self._discard(tmp_dir)  # every rank is past its writes: DCP gathered the failure
            raise CheckpointError(
                f"saving step {step} into {tmp_dir} failed: {describe_dcp_error(exc)}"
            ) from exc
        # Every rank has finished writing its shards (all_gather is a barrier).
        self._finalize(step, tmp_dir, self._gather_outcome(tmp_dir, None))
        return True

    @property
    def pending_step(self) -> int | None:
        """Step of the async save in flight, if any."""
        return None if self._pending is None else self._pending.step

    def write_finished(self) -> bool:
        """True when this rank's async write is done (not collective; not yet committed)."""
        return self._pending is not None and self._pending.future.done()

    def finish(self) -> int | None:
        """Wait for the async save in flight (if any) and commit it; collective.

        Returns:
            The committed step, or ``None`` when nothing was in flight.

        Raises:
            CheckpointError: on every rank, if any rank's write failed.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        error = None
        try:
            pending.future.result()
        except DCP_ERRORS as exc:
            _reraise_stop(exc)
            error = describe_dcp_error(exc, ranks=False)  # _finalize names the rank
        self._finalize(pending.step, pending.tmp_dir, self._gather_outcome(pending.tmp_dir, error))
        return pending.step

    def _finalize(self, step: int, tmp_dir: Path, outcomes: list[tuple[str | None, dict]]) -> None:
        errors = [f"rank {r}: {e}" for r, (e, _) in enumerate(outcomes) if e is not None]
        if errors:
            self._discard(tmp_dir)  # every rank's write has ended (the outcomes were gathered)
            raise CheckpointError(f"saving step {step} into {tmp_dir} failed: {'; '.join(errors)}")
        checksums: dict[str, str] = {}
        for _, part in outcomes:
            checksums.update(part)
        final = self._agree(lambda: self._commit(step, tmp_dir, checksums))
        log.info("checkpoint of step %d complete: %s", step, final)
        if self._on_commit is not None:
            self._on_commit(step)

    def _discard(self, tmp_dir: Path) -> None:
        """Rank 0 deletes a failed save's own temporary folder, so that what it wrote does
        not keep a full disk full (best effort: on a read-only disk it stays, and the next
        scan skips and prunes it)."""
        if self._layout.rank == 0:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    def _plan_save(self, step: int) -> str | None:
        root = self._root()
        root.mkdir(parents=True, exist_ok=True)
        final = root / store.step_dir_name(step)
        if final.exists() and store.sound(final):
            return None
        tmp_dir = root / store.tmp_dir_name(step, attempt=self._layout.attempt)
        tmp_dir.mkdir()
        return str(tmp_dir)

    def _gather_outcome(
        self, tmp_dir: Path, error: str | None
    ) -> list[tuple[str | None, dict[str, str]]]:
        """Every rank's (error, checksums of the shard files it wrote); collective.

        DCP's file-system writer names a rank's files ``__<rank>_<n>.distcp``.
        """
        mine: tuple[str | None, dict[str, str]] = (error, {})
        if error is None:
            try:
                mine = (
                    None,
                    {
                        path.name: store.file_checksum(path)
                        for path in sorted(tmp_dir.glob(f"__{self._layout.rank}_*"))
                    },
                )
            except OSError as exc:
                mine = (f"checksumming shards: {exc}", {})
        if self._layout.world_size == 1:
            return [mine]
        gathered: list[Any] = [None] * self._layout.world_size
        dist.all_gather_object(gathered, mine)
        return [(item[0], item[1]) for item in gathered]

    def _commit(self, step: int, tmp_dir: Path, checksums: dict[str, str]) -> str:
        if not (tmp_dir / store.METADATA_NAME).is_file():
            raise CheckpointError(f"{tmp_dir} has no {store.METADATA_NAME} after dcp.save")
        files = sorted(p.name for p in tmp_dir.iterdir() if p.is_file())
        checksums = {
            name: checksums.get(name) or store.file_checksum(tmp_dir / name) for name in files
        }
        if self._hook is not None:
            self._hook("before_marker", step)
        layout = self._layout
        marker = store.CompletionMarker(
            step=step,
            files=files,
            world_size=layout.world_size,
            dp=layout.dp,
            tp=layout.tp,
            attempt=layout.attempt,
            time=time.time(),
            checksums=checksums,
        )
        store.write_marker(tmp_dir, marker)
        final = store.commit(tmp_dir, step)
        # Prune only now: "latest" has moved and is durable (FC-11).
        for removed in store.prune(self._root(), keep=self._config.keep):
            log.info("removed old or partial checkpoint %s", removed)
        return str(final)

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
        found = store.scan(self._root())
        for partial in found.partial:
            log.warning("skipping partial checkpoint %s: %s", partial.path, partial.reason)
        latest = None
        for candidate in reversed(found.complete):  # newest first
            corrupt = store.checksum_mismatch(candidate)
            if corrupt is None:
                latest = candidate
                break
            log.warning("skipping corrupt checkpoint %s: %s", candidate.path, corrupt)
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
            except Exception as exc:  # raised on every rank below, with this text
                log.debug("checkpoint decision failed on rank 0", exc_info=True)
                box[0] = ("error", f"{type(exc).__name__}: {exc}")
        if self._layout.world_size > 1:
            dist.broadcast_object_list(box, src=0)
        status, value = box[0]
        if status == "error":
            raise CheckpointError(f"rank 0: {value}")
        return value


__all__ = ["Checkpointer", "FaultHook"]
