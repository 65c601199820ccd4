"""The collective steps of one save (FC-11), over one process group.

1. :meth:`SaveProtocol.open`: rank 0 picks a fresh per-attempt temporary folder
   (or finds the step already complete) and broadcasts the choice;
2. :meth:`SaveProtocol.write`: every rank writes its shards with ``dcp.save``
   (which returns after rank 0 has written ``.metadata``);
3. :meth:`SaveProtocol.outcomes`: every rank checksums the shard files it wrote and
   gathers every rank's (error, checksums) (a barrier: every rank is past its writes);
4. :meth:`SaveProtocol.commit`: rank 0 writes the completion marker (file list and
   checksums), renames the folder to ``step-XXXXXXXX``, prunes old checkpoints and
   broadcasts the outcome, so all ranks succeed or raise together.

A sync save runs these on the training thread over the default group; an async
save runs them on its writer thread over the checkpointer's own gloo group
(:mod:`stormwatch.trainer.checkpoint.background`). A crash at any point before the
marker leaves a folder that resume skips as partial
(:mod:`stormwatch.trainer.checkpoint.store`).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlanner

from stormwatch.trainer.checkpoint import store
from stormwatch.trainer.checkpoint.state import RankLayout
from stormwatch.trainer.errors import CheckpointError, ResumeRefused

log = logging.getLogger(__name__)

T = TypeVar("T")

#: ``hook(phase, step)``: called at each phase of a save (on the writing thread), phases as in
#: :data:`stormwatch.faults.control_file.CHECKPOINT_PHASES` (the ``checkpoint_kill`` fault
#: point of :class:`stormwatch.trainer.control.ControlChannel` is the hook).
FaultHook = Callable[[str, int], None]

#: Every rank's (error or ``None``, {shard file name: ``crc32:...``}), by rank.
Outcomes = list[tuple[str | None, dict[str, str]]]


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


class SaveProtocol:
    """The steps of a save over ``group``; every method is collective over it.

    Args:
        root: the checkpoint folder (``--checkpoint-dir``).
        keep: complete checkpoints kept by the prune after a commit.
        layout: this rank's position (written into the marker).
        hook: the fault hook called at each phase, or ``None``.
        group: the process group of the collectives (``None``: the default group).
        settings: the run's settings, written into the marker
            (:mod:`stormwatch.trainer.checkpoint.settings`).
    """

    def __init__(
        self,
        root: Path,
        *,
        keep: int,
        layout: RankLayout,
        hook: FaultHook | None,
        group: dist.ProcessGroup | None = None,
        settings: dict[str, int | float | str] | None = None,
    ) -> None:
        self.root = root
        self._settings = dict(settings or {})
        self._keep = keep
        self._layout = layout
        self._hook = hook
        self._group = group

    def open(self, step: int) -> Path | None:
        """A fresh temporary folder for ``step``, or ``None`` when a sound checkpoint of
        ``step`` exists already (nothing to write).

        Raises:
            CheckpointError: on every rank, if rank 0 could not create it.
        """
        name = self.agree(lambda: self._open(step))
        return None if name is None else Path(name)

    def write(
        self, state: dict[str, Any], tmp_dir: Path, step: int, planner: SavePlanner | None = None
    ) -> None:
        """``dcp.save`` of this rank's ``state`` into ``tmp_dir`` (DCP's errors propagate:
        its ``CheckpointException`` is a ``BaseException``)."""
        writer = _Writer(tmp_dir, step=step, hook=self._hook)
        dcp.save(
            state,
            checkpoint_id=tmp_dir,
            storage_writer=writer,
            planner=planner,
            process_group=self._group,
        )

    def outcomes(self, tmp_dir: Path, error: str | None) -> Outcomes:
        """Every rank's (error, checksums of the shard files it wrote).

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
        return [(item[0], item[1]) for item in self.gather(mine)]

    def commit(self, step: int, tmp_dir: Path, outcomes: Outcomes) -> Path:
        """Rank 0 marks ``tmp_dir`` complete and renames it; returns the final folder.

        Raises:
            CheckpointError: on every rank, if any rank's write failed (the folder is
                deleted) or the marker or rename failed on rank 0.
        """
        errors = [f"rank {r}: {e}" for r, (e, _) in enumerate(outcomes) if e is not None]
        if errors:
            self.discard(tmp_dir)  # every rank's write has ended (the outcomes were gathered)
            raise CheckpointError(f"saving step {step} into {tmp_dir} failed: {'; '.join(errors)}")
        checksums: dict[str, str] = {}
        for _, part in outcomes:
            checksums.update(part)
        return Path(self.agree(lambda: self._commit(step, tmp_dir, checksums)))

    def discard(self, tmp_dir: Path) -> None:
        """Rank 0 deletes a failed save's own temporary folder, so that what it wrote does
        not keep a full disk full (best effort: on a read-only disk it stays, and the next
        scan skips and prunes it). Not collective."""
        if self._layout.rank == 0:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    def agree(self, decide: Callable[[], T]) -> T:
        """Run ``decide`` on rank 0 only and give every rank its result (or its error).

        Raises:
            ResumeRefused: on every rank, with rank 0's message, if ``decide`` raised it.
            CheckpointError: on every rank, with rank 0's error, if ``decide`` raised.
        """
        box: list[Any] = [None]
        if self._layout.rank == 0:
            try:
                box[0] = ("ok", decide())
            except ResumeRefused as exc:  # the user's decision: its message as it is
                box[0] = ("refused", str(exc))
            except Exception as exc:  # raised on every rank below, with this text
                log.debug("checkpoint decision failed on rank 0", exc_info=True)
                box[0] = ("error", f"{type(exc).__name__}: {exc}")
        if self._layout.world_size > 1:
            dist.broadcast_object_list(box, src=0, group=self._group)
        status, value = box[0]
        if status == "refused":
            raise ResumeRefused(value)
        if status == "error":
            raise CheckpointError(f"rank 0: {value}")
        return value

    def gather(self, mine: T) -> list[T]:
        """Every rank's ``mine``, by rank (a barrier)."""
        if self._layout.world_size == 1:
            return [mine]
        gathered: list[Any] = [None] * self._layout.world_size
        dist.all_gather_object(gathered, mine, group=self._group)
        return gathered

    def _open(self, step: int) -> str | None:
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / store.step_dir_name(step)
        if final.exists() and store.sound(final):
            return None
        tmp_dir = self.root / store.tmp_dir_name(step, attempt=self._layout.attempt)
        tmp_dir.mkdir()
        return str(tmp_dir)

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
            settings=self._settings,
        )
        store.write_marker(tmp_dir, marker)
        final = store.commit(tmp_dir, step)
        # Prune only now: "latest" has moved and is durable (FC-11).
        for removed in store.prune(self.root, keep=self._keep):
            log.info("removed old or partial checkpoint %s", removed)
        return str(final)


__all__ = ["FaultHook", "Outcomes", "SaveProtocol"]
