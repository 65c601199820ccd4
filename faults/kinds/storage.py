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
this node's ranks. The mounts are made in the mount namespace of the job's ranks
on this node (``nsenter --mount``; one set per distinct namespace, usually the
one they inherit from their torchrun), because that is where the trainer sees its
files: a container's, or in the lab the private namespace ``ip netns exec`` gives
each node's processes. Without a running rank (``path`` given, no job), they are
made in the agent's own. The ledger records the namespaces and the mount ids;
revert unmounts only a mount it made that is still the top one at the folder,
and checks it is gone; a namespace whose processes have all exited took its
mounts with it.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import psutil
from pydantic import Field

from stormwatch.faults.base import Fault, FaultRequest, Injection
from stormwatch.faults.errors import FaultError, FaultTargetNotFound
from stormwatch.faults.kind import DetectClass, FaultKind, Placement, Target, Traits
from stormwatch.faults.limits import JobName
from stormwatch.faults.node import FaultContext
from stormwatch.faults.system import job_ranks, rank_option, run, short_tag
from stormwatch.faults.targeting import NodeOrRank

log = logging.getLogger(__name__)

#: Size of the overlay's upper tmpfs; filled at once, so it only needs to hold the overlay's work dirs.
UPPER_TMPFS = "size=256k,nr_inodes=64"
_DEFAULT_SCRATCH = Path("/run/stormwatch-faults")


class _StorageRequest(FaultRequest):
    path: str | None = Field(default=None, pattern=r"^/")
    job: JobName | None = None


class CheckpointReadOnlyRequest(_StorageRequest):
    """``checkpoint_readonly``: ``path`` (default: the job's ``--checkpoint-dir``), ``job``."""

    kind: Literal["checkpoint_readonly"]


class CheckpointFullRequest(_StorageRequest):
    """``checkpoint_full``: ``path`` (default: the job's ``--checkpoint-dir``), ``job``."""

    kind: Literal["checkpoint_full"]


@dataclass(frozen=True)
class _MountNs:
    """A mount namespace, named by a process in it (``pid``) and its inode (``ino``)."""

    pid: int
    ino: int

    @property
    def own(self) -> bool:
        return self.ino == _ns_inode(os.getpid())

    @property
    def root(self) -> Path:
        """The namespace's view of ``/``: ``/proc/<pid>/root`` (the agent's own ``/``)."""
        return Path("/") if self.own else Path(f"/proc/{self.pid}/root")

    def see(self, path: Path) -> Path:
        """``path`` as a process in this namespace sees it, reachable from the agent."""
        return self.root / path.relative_to("/")

    def cmd(self, args: list[str]) -> list[str]:
        """``args`` run inside this namespace (``nsenter --mount``)."""
        return args if self.own else ["nsenter", f"--mount=/proc/{self.pid}/ns/mnt", "--", *args]

    def record(self) -> dict[str, int]:
        return {"ns_pid": self.pid, "ns_ino": self.ino}


def _ns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/mnt").st_ino


def _namespaces_of(pids: list[int]) -> list[_MountNs]:
    """One :class:`_MountNs` per distinct mount namespace of ``pids`` (gone pids skipped)."""
    found: dict[int, _MountNs] = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # gone: its namespace is none of ours to fill
            ino = _ns_inode(pid)
            found.setdefault(ino, _MountNs(pid, ino))
    return list(found.values())


def _find_ns(record: dict[str, object]) -> _MountNs | None:
    """The recorded namespace if a process still lives in it (else None: it is gone, and
    its mounts with it). Records from before namespaces were kept mean the agent's own."""
    if "ns_ino" not in record:
        return _MountNs(os.getpid(), _ns_inode(os.getpid()))
    pid, ino = int(str(record["ns_pid"])), int(str(record["ns_ino"]))
    with contextlib.suppress(OSError):  # that process is gone: look for another one below
        if _ns_inode(pid) == ino:
            return _MountNs(pid, ino)
    for process in psutil.process_iter():
        with contextlib.suppress(OSError):  # gone or not ours to read: not in that namespace
            if _ns_inode(process.pid) == ino:
                return _MountNs(process.pid, ino)
    return None


def _mounts_at(path: Path, ns: _MountNs) -> list[int]:
    """Mount ids stacked at ``path`` in ``ns``, bottom first (``/proc/<pid>/mountinfo``)."""
    ids: list[int] = []
    try:
        text = Path(f"/proc/{ns.pid}/mountinfo").read_text()
    except OSError:
        return ids
    for line in text.splitlines():
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")
        if point == str(path):
            ids.append(int(fields[0]))
    return ids


def _unmount_if_top(path: Path, mount_id: int, ns: _MountNs) -> None:
    """``umount path`` in ``ns`` when ``mount_id`` is the top mount there; nothing when gone.

    Raises:
        FaultError: it is still mounted but under another mount, or umount failed.
    """
    ids = _mounts_at(path, ns)
    if mount_id not in ids:
        return
    if ids[-1] != mount_id:
        raise FaultError(f"{path}: another mount was stacked on this fault's; unmount it first")
    run(ns.cmd(["umount", str(path)]))
    if mount_id in _mounts_at(path, ns):
        raise FaultError(f"{path}: still mounted (mount id {mount_id}) after umount")


def _new_mount(path: Path, ns: _MountNs, args: list[str]) -> int:
    """Run the mount command ``args`` in ``ns``; the id of the mount it added at ``path``.

    Raises:
        FaultError: it failed or no new mount appeared.
    """
    before = _mounts_at(path, ns)
    run(ns.cmd(args))
    added = [i for i in _mounts_at(path, ns) if i not in before]
    if not added:
        raise FaultError(f"{path}: the mount did not appear")
    return added[-1]


_StorageT = TypeVar("_StorageT", bound=_StorageRequest)


class _StorageFault(Fault[_StorageT]):
    def __init__(self, request: _StorageT) -> None:
        super().__init__(request)
        self._path: Path | None = None
        self._namespaces: list[_MountNs] = []

    def prepare(self, ctx: FaultContext) -> None:
        spec = self.request
        try:
            ranks = job_ranks(ctx, spec.job)
        except FaultTargetNotFound:
            if spec.path is None or spec.job is not None:
                raise
            ranks = []
        if spec.path is not None:
            path = Path(spec.path)
        else:
            found = rank_option(ctx, spec.job, "--checkpoint-dir")
            if found is None:
                raise FaultTargetNotFound(
                    f"no --checkpoint-dir on the ranks of node {ctx.node}; give 'path'"
                )
            path = found
        self._namespaces = _namespaces_of([r.pid for r in ranks]) or _namespaces_of([os.getpid()])
        if not self._namespaces:
            raise FaultTargetNotFound(f"the ranks on node {ctx.node} exited")
        path = Path(os.path.normpath(path))
        for ns in self._namespaces:
            if not ns.see(path).is_dir():
                raise FaultTargetNotFound(f"path: {path} is not a folder on node {ctx.node}")
        self._path = path

    def revert(self, ctx: FaultContext, injection: Injection | None) -> None:
        """Undo every namespace's mounts (only mounts of this fault still on top).

        Raises:
            FaultError: something is still mounted.
        """
        if injection is None:
            return  # crashed before the mount was recorded; an orphan is visible in mountinfo
        details = dict(injection.details)
        for record in details.get("mounts", [details]):
            ns = _find_ns(record)
            if ns is not None:
                self._undo(Path(str(details["path"])), dict(record), ns)
        self.verify(ctx, injection)

    def verify(self, ctx: FaultContext, injection: Injection | None) -> None:
        """No mount this fault made is still at the folder, in any namespace still alive.

        Raises:
            FaultError: naming the mount left.
        """
        if injection is None:
            return
        details = dict(injection.details)
        path = Path(str(details["path"]))
        for record in details.get("mounts", [details]):
            ns = _find_ns(record)
            mount_id = record.get("mount_id")
            if ns is not None and mount_id is not None and int(mount_id) in _mounts_at(path, ns):
                raise FaultError(f"{path}: still mounted (mount id {mount_id}) after revert")

    @staticmethod
    @abc.abstractmethod
    def _undo(path: Path, record: dict[str, object], ns: _MountNs) -> None:
        """Remove this fault's mounts described by ``record`` in ``ns``."""

    def inject(self, ctx: FaultContext) -> Injection:
        assert self._path is not None
        mounts: list[dict[str, object]] = []
        try:
            for ns in self._namespaces:
                record: dict[str, object] = dict(ns.record())
                mounts.append(record)
                self._apply(ctx, self._path, ns, record)
        except (FaultError, OSError) as exc:
            for record, ns in zip(mounts, self._namespaces, strict=False):
                try:  # nothing half-applied
                    self._undo(self._path, record, ns)
                except FaultError as undo:
                    log.warning("%s: undoing the partial mount failed: %s", self.request.kind, undo)
            raise FaultError(f"{self.request.kind} on {self._path}: {exc}") from exc
        return Injection(details={"path": str(self._path), "mounts": mounts})

    @abc.abstractmethod
    def _apply(
        self, ctx: FaultContext, path: Path, ns: _MountNs, record: dict[str, object]
    ) -> None:
        """Make the mounts in ``ns``, noting their ids in ``record`` as they appear."""


class CheckpointReadOnly(_StorageFault[CheckpointReadOnlyRequest]):
    """A read-only bind mount of the folder onto itself."""

    def _apply(
        self, ctx: FaultContext, path: Path, ns: _MountNs, record: dict[str, object]
    ) -> None:
        record["mount_id"] = _new_mount(path, ns, ["mount", "--bind", str(path), str(path)])
        run(ns.cmd(["mount", "-o", "remount,ro,bind", str(path)]))

    @staticmethod
    def _undo(path: Path, record: dict[str, object], ns: _MountNs) -> None:
        if "mount_id" in record:
            _unmount_if_top(path, int(str(record["mount_id"])), ns)


class CheckpointFull(_StorageFault[CheckpointFullRequest]):
    """Overlay (lower: the folder, upper: a full tmpfs) on the folder."""

    def _apply(
        self, ctx: FaultContext, path: Path, ns: _MountNs, record: dict[str, object]
    ) -> None:
        base = (ctx.state_dir / "fault-mounts" if ctx.state_dir else _DEFAULT_SCRATCH) / (
            f"{short_tag(self.request.id)}-{ns.ino}"
        )
        scratch = base / "tmpfs"
        ns.see(scratch).mkdir(parents=True, exist_ok=True)
        record["scratch"] = str(scratch)
        record["tmpfs_id"] = _new_mount(
            scratch,
            ns,
            ["mount", "-t", "tmpfs", "-o", UPPER_TMPFS, "stormwatch-fault", str(scratch)],
        )
        (ns.see(scratch) / "upper").mkdir()
        (ns.see(scratch) / "work").mkdir()
        options = f"lowerdir={path},upperdir={scratch / 'upper'},workdir={scratch / 'work'}"
        record["mount_id"] = _new_mount(
            path, ns, ["mount", "-t", "overlay", "stormwatch-fault", "-o", options, str(path)]
        )
        _fill(ns.see(scratch))

    @staticmethod
    def _undo(path: Path, record: dict[str, object], ns: _MountNs) -> None:
        if "mount_id" in record:
            _unmount_if_top(path, int(str(record["mount_id"])), ns)
        if "scratch" not in record:
            return
        scratch = Path(str(record["scratch"]))
        if "tmpfs_id" in record:
            _unmount_if_top(scratch, int(str(record["tmpfs_id"])), ns)
        if not _mounts_at(scratch, ns):
            shutil.rmtree(ns.see(scratch.parent), ignore_errors=True)


def _fill(scratch: Path) -> None:
    """Use up the tmpfs's blocks, then its inodes, so every write to the overlay fails."""
    with open(scratch / "ballast", "wb", buffering=0) as out:
        for size in (65_536, 4096, 1):
            with contextlib.suppress(OSError):  # full (ENOSPC) at this size: the point
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


def _storage(kind: str, summary: str, request: type[_StorageRequest], fault: type[Fault[Any]]
             ) -> FaultKind:  # fmt: skip
    return FaultKind(
        kind=kind,
        summary=summary,
        traits=Traits(
            target=Target.NODE_OR_RANK,
            placement=Placement.ONE_NODE,
            category="ssd",  # the checkpoint storage failed
            detect_class=DetectClass.CHECKPOINT_FAILING,
            job_scoped=True,
            needs_root=True,
        ),
        targeting=NodeOrRank,
        request=request,
        fault=fault,
    )


CHECKPOINT_READONLY = _storage(
    "checkpoint_readonly",
    "The checkpoint folder becomes read-only (EROFS) on the node: a remounted volume. ``path`` "
    "default: the job's ``--checkpoint-dir`` seen on the node's ranks.",
    CheckpointReadOnlyRequest,
    CheckpointReadOnly,
)
CHECKPOINT_FULL = _storage(
    "checkpoint_full",
    "The checkpoint folder is full (ENOSPC) on the node; existing files stay readable and "
    "nothing is ever deleted. ``path`` as for ``checkpoint_readonly``.",
    CheckpointFullRequest,
    CheckpointFull,
)

__all__ = [
    "CHECKPOINT_FULL",
    "CHECKPOINT_READONLY",
    "CheckpointFull",
    "CheckpointFullRequest",
    "CheckpointReadOnly",
    "CheckpointReadOnlyRequest",
]
