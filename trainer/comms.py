"""Count the collectives a training step really issues, with a ``TorchDispatchMode``.

Every collective that FSDP2, DTensor and our own code issue passes the
dispatcher as a ``c10d::*`` op (process-group calls such as
``_allgather_base_``, ``_reduce_scatter_base_``, ``allreduce_``, each
returning a ``Work``) or as a functional collective
(``_c10d_functional::all_reduce`` etc., used by DTensor, completed later by
``_c10d_functional::wait_tensor``). :class:`CollectiveCounter` sees both, the
same way :class:`torch.distributed.tensor.debug.CommDebugMode` does: it
returns ``NotImplemented`` for tensor subclasses (DTensor,
AsyncCollectiveTensor) so that they first desugar into plain-tensor ops.

Per collective it reports to a :class:`CollectiveSink`:

* ``op``: a stable label from :data:`OP_LABELS` (``all_gather``,
  ``reduce_scatter``, ``all_reduce``, ...), whatever API issued it;
* bytes: total size of the op's *input* tensors on this rank (for
  ``all_gather`` this rank's shard, for ``reduce_scatter`` the full
  unreduced buffer, for ``all_reduce``/``broadcast`` the tensor, for the
  pipeline's point-to-point ``send``/``recv`` the tensor sent or the buffer
  received into, e.g. one micro-batch's activations ``[mb, seq, d_model]``); 0
  for ``barrier``;
* time, in seconds: wall time from issuing the op until the trainer thread
  observes it complete. Collectives are asynchronous (FSDP2 overlaps them
  with compute), so completion is polled: for ``c10d`` ops,
  ``Work.is_completed()`` is checked before every later dispatched op (gloo:
  the transfer has finished on gloo's thread; NCCL: the collective's CUDA end
  event has fired, i.e. GPU time including queueing behind earlier kernels);
  for functional collectives, completion is when the ``wait_tensor`` on the
  op's output returns. Resolution: the gap between two dispatched ops
  (microseconds on CPU). Leaving the counter is treated as a sync point (the
  training step ends with ``loss.item()`` after every collective was waited
  for): a ``c10d`` op whose ``Work`` still does not report completion then
  is timed by how long its issuing call took, a lower bound. In torch 2.13
  this is the case for gloo's ``reduce_scatter`` (its ``Work`` never reports
  completion, and has no future). Times of overlapping collectives overlap,
  so their sum can exceed the step time.

Besides the per-op sink, the counter can label each collective with the
mesh dimension of its process group (``groups``: process-group name ->
``"pp"``/``"dp_replicate"``/``"dp_shard"``/``"tp"``; other groups are
``"world"`` for the default group, else ``"other"``) and hand a :class:`CollectiveRecord` (op, mesh dimension, group
size, bytes, issue and completion time) to a :class:`CollectiveObserver`.
It also keeps, per step, the wall time during which at least one collective
was in flight (:meth:`CollectiveCounter.take_wait_seconds`, the union of the
issue-to-completion intervals): the "time spent waiting in collectives" of
FC-14. A rank that is slow in compute enters its collectives last, so they
complete almost at once (little wait); the ranks waiting for it sit inside
theirs.

Bookkeeping errors are caught and handed to the sink (which logs and counts
them); they never change what the op does or returns.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type
from torch.utils._pytree import tree_leaves


class CollectiveSink(Protocol):
    """Receives what :class:`CollectiveCounter` observes (on the threads that
    dispatch ops: the training thread and, on GPU, autograd's device threads)."""

    def on_issue(self, op: str, nbytes: int) -> None:
        """One collective ``op`` was issued with ``nbytes`` input bytes."""

    def on_complete(self, op: str, seconds: float) -> None:
        """A collective ``op`` issued ``seconds`` ago was observed complete."""

    def on_error(self, where: str, exc: BaseException) -> None:
        """Bookkeeping failed (the collective itself was not affected)."""


@dataclass(frozen=True)
class CollectiveRecord:
    """One observed collective.

    Attributes:
        op: label from :data:`OP_LABELS`.
        mesh_dim: ``"pp"``/``"dp_replicate"``/``"dp_shard"``/``"tp"`` (the mesh
            dimension of its group),
            ``"world"`` (default group) or ``"other"``.
        group_size: ranks in its process group (``n`` of the bus-bandwidth factor).
        nbytes: input bytes on this rank (as reported to ``on_issue``).
        start: issue time (counter clock, seconds).
        end: observed completion time (counter clock, seconds).
    """

    op: str
    mesh_dim: str
    group_size: int
    nbytes: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        """Issue-to-completion latency, seconds."""
        return max(self.end - self.start, 0.0)


class CollectiveObserver(Protocol):
    """Receives a :class:`CollectiveRecord` for every collective seen complete."""

    def on_collective(self, record: CollectiveRecord) -> None:
        """One collective completed (called on the thread that observed it)."""


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals, seconds."""
    total = 0.0
    current_start = current_end = None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total


def _ops(namespace: Any, names: Iterable[str]) -> list[Any]:
    found = []
    for name in names:
        try:
            found.append(getattr(namespace, name))
        except AttributeError:  # op absent from this torch build
            continue
    return found


def _build_op_labels() -> dict[Any, str]:
    c10d = torch.ops.c10d
    native = torch.ops._c10d_functional
    table: dict[str, tuple[list[str], list[str]]] = {
        # label: (c10d op names, functional op names)
        "all_gather": (
            [
                "_allgather_base_",
                "allgather_",
                "allgather_coalesced_",
                "allgather_into_tensor_coalesced_",
            ],
            ["all_gather_into_tensor", "all_gather_into_tensor_coalesced"],
        ),
        "reduce_scatter": (
            ["_reduce_scatter_base_", "reduce_scatter_", "reduce_scatter_tensor_coalesced_"],
            ["reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"],
        ),
        "all_reduce": (
            ["allreduce_", "allreduce_coalesced_"],
            ["all_reduce", "all_reduce_coalesced"],
        ),
        "all_to_all": (["alltoall_", "alltoall_base_"], ["all_to_all_single"]),
        "broadcast": (["broadcast_"], ["broadcast"]),
        "reduce": (["reduce_"], []),
        "gather": (["gather_"], []),
        "scatter": (["scatter_"], []),
        "barrier": (["barrier"], []),
        "send": (["send"], []),
        "recv": (["recv_", "recv_any_source_"], []),
    }
    labels: dict[Any, str] = {}
    for label, (c10d_names, funcol_names) in table.items():
        for packet in _ops(c10d, c10d_names) + _ops(native, funcol_names):
            labels[packet] = label
    return labels


#: Overload packet of every counted op -> its ``op`` label.
OP_LABELS: dict[Any, str] = _build_op_labels()
_WAIT_TENSOR = torch.ops._c10d_functional.wait_tensor
_INPUT_ARG_NAMES = frozenset(
    {"input", "inputs", "input_tensor", "input_tensors", "tensors", "tensor", "self"}
)


def _input_bytes(func: Any, label: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    if label == "barrier":
        return 0
    total = 0
    for index, argument in enumerate(func._schema.arguments):
        if argument.name not in _INPUT_ARG_NAMES:
            continue
        value = args[index] if index < len(args) else kwargs.get(argument.name)
        for leaf in tree_leaves(value):
            if isinstance(leaf, torch.Tensor):
                total += leaf.numel() * leaf.element_size()
    return total


def _address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _find_work(out: Any) -> Any | None:
    for leaf in tree_leaves(out):
        if isinstance(leaf, torch.ScriptObject):
            try:
                return torch._C._distributed_c10d.Work.unbox(leaf)
            except (RuntimeError, TypeError):
                continue
    return None


@dataclass(frozen=True)
class _Issued:
    seq: int
    label: str
    mesh_dim: str
    group_size: int
    nbytes: int
    start: float
    call_seconds: float


def _argument(func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    for index, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return args[index] if index < len(args) else kwargs.get(name)
    return None


class CollectiveCounter(TorchDispatchMode):
    """Dispatch mode that reports every collective to ``sink`` (see module docstring).

    Use as a context manager around the code to observe (one training step)::

        with CollectiveCounter(sink):
            loss = train_step(...)

    Args:
        sink: receives counts, bytes and completion times.
        clock: monotonic clock in seconds (default :func:`time.perf_counter`).
        groups: process-group name -> mesh dimension label (``"dp_shard"``, ``"tp"``, ...);
            see :meth:`ParallelDims.group_names`. Other groups are labelled
            ``"world"`` (the default group) or ``"other"``.
        observer: receives a :class:`CollectiveRecord` per completed collective.
        recent: how many of the latest collectives :meth:`recent` keeps (for
            the per-rank hang dump, :mod:`stormwatch.trainer.dump`).
        enabled: ``False`` makes entering the counter a no-op (no dispatch
            mode, nothing observed, :meth:`take_wait_seconds` returns 0): the
            "bare" trainer of ``benchmarks/trainer_bench.py``.
    """

    def __init__(
        self,
        sink: CollectiveSink,
        *,
        clock: Callable[[], float] = time.perf_counter,
        groups: Mapping[str, str] | None = None,
        observer: CollectiveObserver | None = None,
        recent: int = 256,
        enabled: bool = True,
    ):
        super().__init__()
        self.enabled = enabled
        self._sink = sink
        self._clock = clock
        self._groups = dict(groups or {})
        self._observer = observer
        self._group_cache: dict[str, tuple[str, int]] = {}
        # functional collectives: output storage address -> what was issued.
        # Keyed by address because wait_tensor may get another tensor object
        # (an alias) for the same output.
        self._pending: dict[int, _Issued] = {}
        # c10d Work objects not yet seen complete
        self._works: list[tuple[Any, _Issued]] = []
        # (start, end) of the collectives completed since take_wait_seconds()
        self._intervals: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._seq = 0
        self._recent: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()
        self._recent_capacity = recent
        #: Called as ``interceptor(op, mesh_dim)`` before each collective is
        #: issued, on the issuing thread; ``None`` (the default) costs nothing.
        #: Set by the training loop while a collective fault point is armed.
        self.interceptor: Callable[[str, str], None] | None = None

    def __enter__(self) -> CollectiveCounter:
        if self.enabled:
            super().__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.enabled:
            return
        super().__exit__(*exc_info)
        if exc_info[0] is None:
            self.poll(final=True)
        else:  # the step failed: what is pending may never complete
            with self._lock:
                self._works.clear()
                self._pending.clear()

    def recent(self) -> list[dict[str, Any]]:
        """The latest collectives, oldest first, as JSON-ready dicts.

        Keys: ``seq`` (issue order in this process, from 1), ``op``,
        ``mesh_dim``, ``group_size``, ``nbytes``, ``issued_at`` (Unix time),
        ``seconds`` (issue to observed completion; ``None`` while pending).
        """
        with self._lock:
            return [dict(entry) for entry in self._recent.values()]

    def take_wait_seconds(self) -> float:
        """Seconds during which at least one collective was in flight, since the last call.

        Call it once per step, after leaving the counter: it is the step's
        collective wait (union of issue-to-completion intervals, so overlapping
        collectives count once).
        """
        with self._lock:
            intervals, self._intervals = self._intervals, []
        return union_seconds(intervals)

    def poll(self, *, final: bool = False) -> None:
        """Report the completion of every pending ``c10d`` op that has finished.

        Args:
            final: the caller knows every issued op has completed (end of a
                step); ops that do not report completion get their call time.
        """
        if not self._works and not (final and self._pending):
            return
        try:
            now = self._clock()
            with self._lock:
                still: list[tuple[Any, _Issued]] = []
                done: list[tuple[_Issued, float]] = []
                for work, issued in self._works:
                    if work.is_completed():
                        done.append((issued, now))
                    elif final:
                        done.append((issued, issued.start + issued.call_seconds))
                    else:
                        still.append((work, issued))
                self._works = still
                if final:
                    self._pending.clear()  # never waited inside the counter: untimed
            for issued, end in done:
                self._completed(issued, end)
        except Exception as exc:
            self._sink.on_error("collectives", exc)

    def _completed(self, issued: _Issued, end: float) -> None:
        with self._lock:
            self._intervals.append((issued.start, end))
            entry = self._recent.get(issued.seq)
            if entry is not None:
                entry["seconds"] = end - issued.start
        self._sink.on_complete(issued.label, end - issued.start)
        if self._observer is not None:
            self._observer.on_collective(
                CollectiveRecord(
                    op=issued.label,
                    mesh_dim=issued.mesh_dim,
                    group_size=issued.group_size,
                    nbytes=issued.nbytes,
                    start=issued.start,
                    end=end,
                )
            )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        # Let DTensor / AsyncCollectiveTensor desugar first; their inner ops come back here.
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented
        self.poll()
        packet = func._overloadpacket
        if packet is _WAIT_TENSOR:
            out = func(*args, **kwargs)
            self._complete_functional(args[0] if args else kwargs.get("tensor"))
            return out
        label = OP_LABELS.get(packet)
        if label is None:
            return func(*args, **kwargs)
        start = self._clock()
        hook = self.interceptor
        if hook is not None:  # a chaos fault point is armed (stormwatch.trainer.control)
            hook(label, self._mesh_dim_or_other(func, args, kwargs))
        out = func(*args, **kwargs)
        self._issued(func, label, start, self._clock() - start, args, kwargs, out)
        return out

    def _mesh_dim_or_other(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        try:
            return self._group(func, args, kwargs)[0]
        except Exception as exc:
            self._sink.on_error("collectives", exc)
            return "other"

    def _group(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, int]:
        """(mesh dimension label, group size) of the op's process group."""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        name = _argument(func, "group_name", args, kwargs)
        group = None
        if name is None:
            group = _argument(func, "process_group", args, kwargs)
            if isinstance(group, torch.ScriptObject):
                group = torch._C._distributed_c10d.ProcessGroup.unbox(group)
            if group is None:
                return "other", 1
            name = group.group_name
        cached = self._group_cache.get(name)
        if cached is not None:
            return cached
        if group is None:
            group = c10d._resolve_process_group(name)
        world = dist.group.WORLD if dist.is_initialized() else None
        dim = self._groups.get(name)
        if dim is None:
            dim = "world" if world is not None and world.group_name == name else "other"
        cached = (dim, group.size())
        self._group_cache[name] = cached
        return cached

    def _issued(
        self,
        func: Any,
        label: str,
        start: float,
        call_seconds: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
    ) -> None:
        try:
            nbytes = _input_bytes(func, label, args, kwargs)
            self._sink.on_issue(label, nbytes)
            mesh_dim, size = self._group(func, args, kwargs)
            with self._lock:
                self._seq += 1
                issued = _Issued(self._seq, label, mesh_dim, size, nbytes, start, call_seconds)
                self._recent[issued.seq] = {
                    "seq": issued.seq,
                    "op": label,
                    "mesh_dim": mesh_dim,
                    "group_size": size,
                    "nbytes": nbytes,
                    "issued_at": time.time() - (self._clock() - start),
                    "seconds": None,
                }
                while len(self._recent) > self._recent_capacity:
                    self._recent.popitem(last=False)
            work = _find_work(out)
            if work is not None:
                with self._lock:
                    self._works.append((work, issued))
            else:  # functional collective: one wait_tensor per output tensor
                with self._lock:
                    for tensor in tree_leaves(out):
                        if isinstance(tensor, torch.Tensor):
                            self._pending[_address(tensor)] = issued
        except Exception as exc:  # never let bookkeeping break a collective
            self._sink.on_error("collectives", exc)

    def _complete_functional(self, tensor: Any) -> None:
        try:
            if not isinstance(tensor, torch.Tensor):
                return
            with self._lock:
                issued = self._pending.pop(_address(tensor), None)
            if issued is not None:
                self._completed(issued, self._clock())
        except Exception as exc:
            self._sink.on_error("collectives", exc)


__all__ = [
    "OP_LABELS",
    "CollectiveCounter",
    "CollectiveObserver",
    "CollectiveRecord",
    "CollectiveSink",
    "union_seconds",
]
