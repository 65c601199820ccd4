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
  unreduced buffer, for ``all_reduce``/``broadcast`` the tensor); 0 for
  ``barrier``;
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

Bookkeeping errors are caught and handed to the sink (which logs and counts
them); they never change what the op does or returns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
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


class CollectiveCounter(TorchDispatchMode):
    """Dispatch mode that reports every collective to ``sink`` (see module docstring).

    Use as a context manager around the code to observe (one training step)::

        with CollectiveCounter(sink):
            loss = train_step(...)

    Args:
        sink: receives counts, bytes and completion times.
        clock: monotonic clock in seconds (default :func:`time.perf_counter`).
    """

    def __init__(self, sink: CollectiveSink, *, clock: Callable[[], float] = time.perf_counter):
        super().__init__()
        self._sink = sink
        self._clock = clock
        # functional collectives: output storage address -> (label, issue time).
        # Keyed by address because wait_tensor may get another tensor object
        # (an alias) for the same output.
        self._pending: dict[int, tuple[str, float]] = {}
        # c10d Work objects not yet seen complete: (work, label, issue time, call seconds)
        self._works: list[tuple[Any, str, float, float]] = []
        self._lock = threading.Lock()

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)
        if exc_info[0] is None:
            self.poll(final=True)
        else:  # the step failed: what is pending may never complete
            with self._lock:
                self._works.clear()
                self._pending.clear()

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
                still: list[tuple[Any, str, float, float]] = []
                done: list[tuple[str, float]] = []
                for work, label, start, call_seconds in self._works:
                    if work.is_completed():
                        done.append((label, now - start))
                    elif final:
                        done.append((label, call_seconds))
                    else:
                        still.append((work, label, start, call_seconds))
                self._works = still
                if final:
                    self._pending.clear()  # never waited inside the counter: untimed
            for label, seconds in done:
                self._sink.on_complete(label, seconds)
        except Exception as exc:
            self._sink.on_error("collectives", exc)

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
        out = func(*args, **kwargs)
        self._issued(func, label, start, self._clock() - start, args, kwargs, out)
        return out

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
            self._sink.on_issue(label, _input_bytes(func, label, args, kwargs))
            work = _find_work(out)
            if work is not None:
                with self._lock:
                    self._works.append((work, label, start, call_seconds))
            else:  # functional collective: one wait_tensor per output tensor
                with self._lock:
                    for tensor in tree_leaves(out):
                        if isinstance(tensor, torch.Tensor):
                            self._pending[_address(tensor)] = (label, start)
        except Exception as exc:  # never let bookkeeping break a collective
            self._sink.on_error("collectives", exc)

    def _complete_functional(self, tensor: Any) -> None:
        try:
            if not isinstance(tensor, torch.Tensor):
                return
            with self._lock:
                entry = self._pending.pop(_address(tensor), None)
            if entry is not None:
                label, start = entry
                self._sink.on_complete(label, self._clock() - start)
        except Exception as exc:
            self._sink.on_error("collectives", exc)


__all__ = ["OP_LABELS", "CollectiveCounter", "CollectiveSink"]
