"""Storage faults on the checkpoint folder: read-only, or full. Nothing is ever deleted.

* ``checkpoint_readonly``: the folder is bind-mounted onto itself and the bind
  remounted read-only: every write, create, rename or delete under it fails
  with EROFS, reads still work. Models a volume the kernel remounted read-only
  after an I/O error, or an expired storage lease.
* ``checkpoint_full``: an overlay is mounted on the folder, with the existing
  content as its read-only lower layer and a tiny tmpfs (filled up at once) as
  the upper layer: every file is still readable, every write, create or
  delete fails with ENOSPC. Models a full filesystem (a quota reached, a
  runaway log). The real folder underneath is never written, so the revert
  (unmounting the overlay, then the tmpfs) cannot lose or change data.

The folder is ``path`` or, by default, the job's ``--checkpoint-dir`` seen on
this node's ranks. The mount is the agent's mount namespace (on a node: the
host's; the lab's nodes share one, like a shared filesystem). The ledger
records the mount ids; revert unmounts only a mount it made that is still the
top one at the folder, and checks it is gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Literal

from pydantic import Field

from stormwatch.agent.errors import FaultError, FaultTargetNotFound
from stormwatch.agent.faults._system import rank_option, run, short_tag
from stormwatch.agent.faults.base import Fault, FaultContext, FaultSpec, Injection

#: Size of the overlay's upper tmpfs; filled at once, so it only needs to hold the overlay's work dirs.
UPPER_TMPFS = "size=256k,nr_inodes=64"
_DEFAULT_SCRATCH = Path("/run/stormwatch-faults")


class _StorageSpec(FaultSpec):
    path: str | None = Field(default=None, pattern=r"^/")
    job: str | None = Field(default=None, min_length=1)


class CheckpointReadOnlySpec(_StorageSpec):
    """``checkpoint_readonly``: ``path`` (default: the job's ``--checkpoint-dir``), ``job``."""

    kind: Literal["checkpoint_readonly"]


class CheckpointFullSpec(_StorageSpec):
    """``checkpoint_full``: ``path`` (default: the job's ``--checkpoint-dir``), ``job``."""

    kind: Literal["checkpoint_full"]


def _mounts_at(path: Path) -> list[int]:
    """Mount ids stacked at ``path``, bottom first (``/proc/self/mountinfo``)."""
    ids = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")
        if point == str(path):
            ids.append(int(fields[0]))
    return ids


def _unmount_if_top(path: Path, mount_id: int) -> None:
    """``umount path`` when ``mount_id`` is the top mount there; nothing when it is gone.

    Raises:
        FaultError: it is still mounted but under another mount, or umount failed.
    """
    ids = _mounts_at(path)
    if mount_id not in ids:
        return
    if ids[-1] != mount_id:
        raise FaultError(f"{path}: another mount was stacked on this fault's; unmount it first")
    run(["umount", str(path)])
    if mount_id in _mounts_at(path):
        raise FaultError(f"{path}: still mounted (mount id {mount_id}) after umount")


class _StorageFault(Fault):
    def __init__(self, spec: FaultSpec) -> None:
        super().__init__(spec)
        self._path: Path | None = None

    def prepare(self, ctx: FaultContext) -> None:
        assert isinstance(self.spec, _StorageSpec)
        if self.spec.path is not None:
            path = Path(self.spec.path)
        else:
            found = rank_option(ctx, self.spec.job, "--checkpoint-dir")
            if found is None:
                raise FaultTargetNotFound(
                    f"no --checkpoint-dir on the ranks of node {ctx.node}; give 'path'"
                )
            path = found
        path = path.resolve()
        if not path.is_dir():
            raise FaultTargetNotFound(f"path: {path} is not a folder on node {ctx.node}")
        self._path = path


class CheckpointReadOnly(_StorageFault):
    """A read-only bind mount of the folder onto itself."""

    kind = "checkpoint_readonly"
    spec_type = CheckpointReadOnlySpec

    def inject(self, ctx: FaultContext) -> Injection:
        assert self._path is not None
        before = _mounts_at(self._path)
        run(["mount", "--bind", str(self._path), str(self._path)])
        added = [i for i in _mounts_at(self._path) if i not in before]
        if not added:
            raise FaultError(f"{self._path}: bind mount did not appear")
        details = {"path": str(self._path), "mount_id": added[-1]}
        try:
            run(["mount", "-o", "remount,ro,bind", str(self._path)])
        except FaultError:
            _unmount_if_top(self._path, added[-1])
            raise
        return Injection(details=details)

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Unmount the read-only bind (only if it is this fault's and on top).

        Raises:
            FaultError: it could not be unmounted.
        """
        if injection is None:
            return  # crashed before the mount was recorded; an orphan bind is visible in mountinfo
        _unmount_if_top(Path(injection.details["path"]), int(injection.details["mount_id"]))


class CheckpointFull(_StorageFault):
    """Overlay (lower: the folder, upper: a full tmpfs) on the folder."""

    kind = "checkpoint_full"
    spec_type = CheckpointFullSpec

    def inject(self, ctx: FaultContext) -> Injection:
        assert self._path is not None
        base = (ctx.state_dir / "fault-mounts" if ctx.state_dir else _DEFAULT_SCRATCH) / short_tag(
            self.spec.id
        )
        scratch = base / "tmpfs"
        scratch.mkdir(parents=True, exist_ok=True)
        before_tmp = _mounts_at(scratch)
        run(["mount", "-t", "tmpfs", "-o", UPPER_TMPFS, "stormwatch-fault", str(scratch)])
        tmp_id = next(i for i in _mounts_at(scratch) if i not in before_tmp)
        details = {"path": str(self._path), "scratch": str(scratch), "tmpfs_id": tmp_id}
        try:
            (scratch / "upper").mkdir()
            (scratch / "work").mkdir()
            before = _mounts_at(self._path)
            run(
                [
                    "mount", "-t", "overlay", "stormwatch-fault", "-o",
                    f"lowerdir={self._path},upperdir={scratch / 'upper'},workdir={scratch / 'work'}",
                    str(self._path),
                ]
            )  # fmt: skip
            details["mount_id"] = next(i for i in _mounts_at(self._path) if i not in before)
            _fill(scratch)
        except (FaultError, OSError, StopIteration) as exc:
            self._undo(details)
            raise FaultError(f"checkpoint_full on {self._path}: {exc}") from exc
        return Injection(details=details)

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Unmount the overlay, then the tmpfs; remove the scratch folder.

        Raises:
            FaultError: something is still mounted.
        """
        if injection is not None:
            self._undo(dict(injection.details))

    @staticmethod
    def _undo(details: dict[str, object]) -> None:
        if "mount_id" in details:
            _unmount_if_top(Path(str(details["path"])), int(str(details["mount_id"])))
        scratch = Path(str(details["scratch"]))
        _unmount_if_top(scratch, int(str(details["tmpfs_id"])))
        if not _mounts_at(scratch):
            shutil.rmtree(scratch.parent, ignore_errors=True)


def _fill(scratch: Path) -> None:
    """Use up the tmpfs's blocks, then its inodes, so every write to the overlay fails."""
    with open(scratch / "ballast", "wb", buffering=0) as out:
        for size in (65_536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)
    for i in range(100_000):
        try:
            os.close(os.open(scratch / f"ballast-{i}", os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                return
            raise
    raise FaultError(f"{scratch}: could not fill the tmpfs")


__all__ = [
    "CheckpointFull",
    "CheckpointFullSpec",
    "CheckpointReadOnly",
    "CheckpointReadOnlySpec",
]
