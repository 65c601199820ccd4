"""On-disk layout of the checkpoint folder and what makes a checkpoint complete (FC-11).

Layout of ``--checkpoint-dir``::

    step-00000010/                        complete checkpoint of step 10
        .metadata                         written by DCP's coordinator (rank 0)
        __0_0.distcp, __1_0.distcp, ...   one shard file per rank
        stormwatch-complete.json          our marker, written last
    step-00000012.tmp-a0-3f9c2b1e/        save in progress (attempt 0), or left by a crash

A save writes into a fresh ``step-XXXXXXXX.tmp-a<attempt>-<token>`` folder;
when every rank has finished, rank 0 writes the marker (step + file list),
fsyncs, and renames the folder to ``step-XXXXXXXX`` (an atomic rename on one
filesystem). A checkpoint is **complete** only if its folder has the
canonical name, ``.metadata`` and a valid marker whose step matches the
name and whose listed files all exist. Everything else under the root that
looks like a checkpoint is *partial*: skipped (with a warning) on resume.

What is deleted, and what never is: :func:`prune` deletes complete checkpoints
beyond ``keep`` and this trainer's own leftovers (``.tmp-`` folders of saves that
never committed, ``.partial-`` folders of older versions), never a final-named
``step-XXXXXXXX`` folder that is partial: the save protocol never leaves one (the
rename comes after the marker), so it is damage or a copy, and it is the user's.
Such folders (and complete ones whose checksums do not match) are set aside as
``step-XXXXXXXX.damaged-<token>`` (:func:`set_aside`) by resume and by a save of the
same step, with a warning, and never deleted. Files (not folders) are ignored.

Only rank 0 calls the functions that change the folder; the caller
broadcasts rank 0's decisions (:mod:`stormwatch.trainer.checkpoint.checkpointer`). No
torch import here.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

MARKER_NAME = "stormwatch-complete.json"
METADATA_NAME = ".metadata"
log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^step-(\d{8})$")
_TMP_RE = re.compile(r"^step-(\d{8})\.tmp-(.+)$")
_ASIDE_RE = re.compile(r"^step-(\d{8})\.partial-(.+)$")
#: Damaged folders set aside by :func:`set_aside`: no checkpoint pattern matches them.
DAMAGED_INFIX = ".damaged-"


class CompletionMarker(BaseModel):
    """Content of ``stormwatch-complete.json``.

    Attributes:
        step: training step the checkpoint holds (last completed step).
        files: names of every file DCP wrote (``.metadata`` included), sorted.
        world_size: ranks that wrote it.
        dp: data-parallel degree at save time.
        tp: tensor-parallel degree at save time.
        attempt: torchrun restart count of the saving worker group.
        time: Unix seconds when the marker was written.
        checksums: file name -> ``crc32:<8 hex digits>`` of every file in
            ``files`` (empty in markers written before checksums existed:
            such checkpoints are not verified).
        settings: the run's settings a resume compares, by option (``--d-model``: 64;
            :mod:`stormwatch.trainer.checkpoint.settings`); empty in older markers.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int
    files: list[str]
    world_size: int
    dp: int
    tp: int
    attempt: int
    time: float
    checksums: dict[str, str] = {}
    settings: dict[str, int | float | str] = {}


@dataclass(frozen=True)
class CompleteCheckpoint:
    """A complete checkpoint folder and its marker."""

    step: int
    path: Path
    marker: CompletionMarker


@dataclass(frozen=True)
class PartialCheckpoint:
    """A folder that looks like a checkpoint but is not complete, and why."""

    path: Path
    reason: str

    @property
    def final(self) -> bool:
        """True for a final-named ``step-XXXXXXXX`` folder (damage or a copy: never the
        leftover of a save, which stays in its ``.tmp-`` folder until the marker is written)."""
        return _STEP_RE.match(self.path.name) is not None


@dataclass(frozen=True)
class CheckpointScan:
    """Result of :func:`scan`: complete checkpoints by ascending step, partial ones by name."""

    complete: tuple[CompleteCheckpoint, ...]
    partial: tuple[PartialCheckpoint, ...]

    @property
    def latest(self) -> CompleteCheckpoint | None:
        """The complete checkpoint with the highest step, if any."""
        return self.complete[-1] if self.complete else None


def step_dir_name(step: int) -> str:
    """``step-00000012`` for step 12."""
    return f"step-{step:08d}"


def tmp_dir_name(step: int, *, attempt: int, token: str | None = None) -> str:
    """A fresh per-attempt temporary folder name, e.g. ``step-00000012.tmp-a1-3f9c2b1e``."""
    return f"{step_dir_name(step)}.tmp-a{attempt}-{token or uuid.uuid4().hex[:8]}"


def read_marker(path: Path) -> CompletionMarker:
    """Parse ``<path>/stormwatch-complete.json``.

    Raises:
        OSError: unreadable file.
        ValueError: not valid JSON or not a :class:`CompletionMarker`.
    """
    return CompletionMarker.model_validate_json((path / MARKER_NAME).read_bytes())


def incomplete_reason(path: Path) -> str | None:
    """Why the folder ``path`` is not a complete checkpoint, or ``None`` if it is."""
    match = _STEP_RE.match(path.name)
    if match is None:
        return "not a final step-XXXXXXXX folder (temporary or set aside)"
    if not path.is_dir():
        return "not a directory"
    if not (path / METADATA_NAME).is_file():
        return f"no {METADATA_NAME} (DCP did not finish)"
    if not (path / MARKER_NAME).is_file():
        return f"no {MARKER_NAME} (save was not committed)"
    try:
        marker = read_marker(path)
    except ValidationError as exc:  # one line: the first problem (pydantic's text spans several)
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"unreadable {MARKER_NAME}: {where + ': ' if where else ''}{first['msg']}"
    except (OSError, ValueError) as exc:
        return f"unreadable {MARKER_NAME}: {exc}"
    if marker.step != int(match.group(1)):
        return f"marker says step {marker.step}, folder name says {int(match.group(1))}"
    missing = [name for name in marker.files if not (path / name).is_file()]
    if missing:
        return f"files listed in the marker are missing: {', '.join(missing[:5])}"
    return None


def scan(root: Path) -> CheckpointScan:
    """Classify the checkpoint folders directly under ``root`` (missing root: empty scan).

    Files are ignored, whatever their name (a stray ``step-00000099`` file is not a
    checkpoint, and nothing here may try to delete it).
    """
    complete: list[CompleteCheckpoint] = []
    partial: list[PartialCheckpoint] = []
    if not root.is_dir():
        return CheckpointScan((), ())
    for path in sorted(root.iterdir()):
        if (
            not (
                _STEP_RE.match(path.name) or _TMP_RE.match(path.name) or _ASIDE_RE.match(path.name)
            )
            or not path.is_dir()
        ):
            continue
        reason = incomplete_reason(path)
        if reason is None:
            complete.append(CompleteCheckpoint(int(path.name[5:13]), path, read_marker(path)))
        else:
            partial.append(PartialCheckpoint(path, reason))
    complete.sort(key=lambda c: c.step)
    return CheckpointScan(tuple(complete), tuple(partial))


def file_checksum(path: Path) -> str:
    """``crc32:<8 hex digits>`` of the file's bytes (read in 1 MiB chunks).

    CRC-32 (zlib) detects torn and bit-flipped files at several GB/s; it is not
    a defence against deliberate tampering.
    """
    crc = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return f"crc32:{crc:08x}"


def checksum_mismatch(checkpoint: CompleteCheckpoint) -> str | None:
    """Why ``checkpoint``'s files do not match its marker's checksums, or ``None``.

    Reads every file listed in the marker's ``checksums``.
    """
    for name, expected in sorted(checkpoint.marker.checksums.items()):
        try:
            actual = file_checksum(checkpoint.path / name)
        except OSError as exc:
            return f"cannot read {name}: {exc}"
        if actual != expected:
            return f"checksum mismatch in {name}: marker has {expected}, file has {actual}"
    return None


def sound(path: Path) -> bool:
    """True when ``path`` is a complete checkpoint whose files match their checksums."""
    if incomplete_reason(path) is not None:
        return False
    checkpoint = CompleteCheckpoint(int(path.name[5:13]), path, read_marker(path))
    return checksum_mismatch(checkpoint) is None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_marker(folder: Path, marker: CompletionMarker) -> None:
    """Write the marker into ``folder`` durably (temp file, fsync, rename, fsync folder)."""
    tmp = folder / (MARKER_NAME + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(marker.model_dump(), sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MARKER_NAME)
    _fsync_dir(folder)


def set_aside(path: Path, reason: str) -> Path:
    """Rename a damaged checkpoint folder to ``<name>.damaged-<token>`` (kept, never deleted:
    it is not this run's to delete) and warn, naming both paths and ``reason``.

    Raises:
        OSError: the rename failed.
    """
    aside = path.with_name(f"{path.name}{DAMAGED_INFIX}{uuid.uuid4().hex[:8]}")
    os.rename(path, aside)
    _fsync_dir(path.parent)
    log.warning(
        "set damaged checkpoint %s aside as %s (%s); it is kept: inspect it, or delete it "
        "when it is no longer needed",
        path,
        aside.name,
        reason,
    )
    return aside


def commit(tmp_dir: Path, step: int) -> Path:
    """Rename a finished temporary folder to ``step-XXXXXXXX`` and return the final path.

    A partial or corrupt folder already holding the final name (a copy, a damaged
    shard: never a leftover of a save) is first set aside (:func:`set_aside`, with a
    warning; it is kept), so the final name only ever points at a complete checkpoint
    and a save never overwrites a folder it did not create.

    Raises:
        FileExistsError: a *complete* checkpoint of ``step`` already exists.
        OSError: the renames failed.
    """
    final = tmp_dir.parent / step_dir_name(step)
    if final.exists():
        if sound(final):
            raise FileExistsError(f"complete checkpoint {final} already exists")
        set_aside(final, f"a save of step {step} needs its name")
        os.rename(tmp_dir, final)
        _fsync_dir(final.parent)
    else:
        os.rename(tmp_dir, final)
        _fsync_dir(final.parent)
    return final


def prune(root: Path, *, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints, and the partial folders
    saves leave (``.tmp-``, ``.partial-``); a partial *final-named* folder is kept (not
    this trainer's leftover: see the module docstring).

    Call only right after a successful :func:`commit` (so no save is in
    flight). Returns the folders removed; failures to remove are left for
    the next prune.
    """
    found = scan(root)
    doomed = [c.path for c in found.complete[:-keep]]
    doomed += [p.path for p in found.partial if not p.final]
    removed = []
    for path in doomed:
        try:
            shutil.rmtree(path)
            removed.append(path)
        except OSError as exc:
            log.warning("could not delete old checkpoint %s (will retry next save): %s", path, exc)
    return removed


__all__ = [
    "DAMAGED_INFIX",
    "MARKER_NAME",
    "METADATA_NAME",
    "CheckpointScan",
    "CompleteCheckpoint",
    "CompletionMarker",
    "PartialCheckpoint",
    "checksum_mismatch",
    "commit",
    "file_checksum",
    "incomplete_reason",
    "prune",
    "read_marker",
    "scan",
    "set_aside",
    "sound",
    "step_dir_name",
    "tmp_dir_name",
    "write_marker",
]
