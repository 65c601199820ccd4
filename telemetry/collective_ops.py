"""The ``c10d`` collective ops, and Python kernels on them alone (not on every op).

Every collective that FSDP2, DTensor, pipelining and our own code issue
reaches the dispatcher as a ``c10d::*`` op (:data:`OP_LABELS`: the
process-group calls ``_allgather_base_``, ``_reduce_scatter_base_``,
``allreduce_``, ``send``, ``recv_``, ..., each returning a ``Work``).
Functional collectives (``_c10d_functional::all_reduce`` etc., DTensor's
tensor parallelism) issue the same ``c10d`` ops from C++, so they are seen
there too, once. :class:`CollectiveKernels` registers one Python kernel per
op overload (``torch.library``, ``with_keyset=True``) at the
``BackendSelect`` dispatch key, which every call passes, also below autograd
and inside tensor-subclass dispatch; the kernel hands the call to the active
:class:`CollectiveIssuer`, which issues it with
``op.redispatch(keyset & keys-after-BackendSelect, ...)``. No other op enters
Python.

Why this mechanism (measured on the 2-core development machine, torch
2.13.0+cpu, gloo; a training step of the default model runs ~1,000 aten ops
and 21 collectives per rank):

* a ``TorchDispatchMode`` (the former counter, like ``CommDebugMode``) sees
  every op: ~6 µs per op for an empty mode, ~9 µs with the counter's
  bookkeeping, +35 % CPU per step, with no way to filter before Python is
  entered;
* a ``TorchFunctionMode`` sees every Python-level torch call (~1.6 µs each)
  and not what C++ issues;
* the flight recorder (on in every run, :mod:`stormwatch.telemetry.dump`) holds
  gloo collectives with sizes and group but, for gloo, no completion time
  (``state`` stays ``"scheduled"``), and reading it costs ~14 µs per entry
  (27 ms for a 2,000-entry ring): right for post-mortems, not per step;
* ``ProcessGroup._register_on_completion_hook``: NCCL only;
* these kernels: nothing per non-collective op; per collective ~13 µs to box
  the call into Python and back (~11 µs also while no counter is entered),
  ~7 µs for gloo's completion callback and ~15 µs of the counter's
  bookkeeping: ~37 µs, 1.5 % of a bare step's CPU time
  (``benchmarks/trainer_bench.py``, README "Benchmarks").

The kernels are process-wide (the dispatcher is): installed by the first
counter entered, then kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.library import Library


def _ops(namespace: Any, names: Iterable[str]) -> list[Any]:
    found = []
    for name in names:
        try:
            found.append(getattr(namespace, name))
        except AttributeError:  # op absent from this torch build
            continue
    return found


def _build_op_labels() -> dict[Any, str]:
    table: dict[str, list[str]] = {
        # label: c10d op names (functional collectives issue these too)
        "all_gather": [
            "_allgather_base_",
            "allgather_",
            "allgather_coalesced_",
            "allgather_into_tensor_coalesced_",
        ],
        "reduce_scatter": [
            "_reduce_scatter_base_",
            "reduce_scatter_",
            "reduce_scatter_tensor_coalesced_",
        ],
        "all_reduce": ["allreduce_", "allreduce_coalesced_"],
        "all_to_all": ["alltoall_", "alltoall_base_"],
        "broadcast": ["broadcast_"],
        "reduce": ["reduce_"],
        "gather": ["gather_"],
        "scatter": ["scatter_"],
        "barrier": ["barrier"],
        "send": ["send"],
        "recv": ["recv_", "recv_any_source_"],
    }
    c10d = torch.ops.c10d
    return {packet: label for label, names in table.items() for packet in _ops(c10d, names)}


#: Overload packet of every counted ``c10d`` op -> its ``op`` label.
OP_LABELS: dict[Any, str] = _build_op_labels()
#: Names of the arguments that hold an op's input tensors (its bytes).
_INPUT_ARG_NAMES = frozenset(
    {"input", "inputs", "input_tensor", "input_tensors", "input_list", "tensors", "tensor"}
)


def _tensor_bytes(value: Any) -> tuple[int, bool]:
    """(bytes of the tensors in ``value``, nested lists included; whether all are on the CPU)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size(), value.device.type == "cpu"
    total, on_cpu = 0, True
    if isinstance(value, (list, tuple)):
        for item in value:
            nbytes, cpu = _tensor_bytes(item)
            total += nbytes
            on_cpu = on_cpu and cpu
    return total, on_cpu


@dataclass(frozen=True)
class OpSpec:
    """One ``c10d`` op overload and where its arguments are, read once from its schema.

    Attributes:
        op: the ``OpOverload``.
        label: its label in :data:`OP_LABELS`.
        inputs: ``(position, name)`` of the input-tensor arguments.
        group: ``(position, name)`` of the process-group argument.
    """

    op: Any
    label: str
    inputs: tuple[tuple[int, str], ...]
    group: tuple[int, str]

    @classmethod
    def of(cls, op: Any, label: str) -> OpSpec:
        arguments = list(enumerate(argument.name for argument in op._schema.arguments))
        inputs = tuple(item for item in arguments if item[1] in _INPUT_ARG_NAMES)
        group = next(item for item in arguments if item[1] == "process_group")
        return cls(op=op, label=label, inputs=inputs, group=group)

    @staticmethod
    def _argument(where: tuple[int, str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        index, name = where
        return args[index] if index < len(args) else kwargs.get(name)

    def input_bytes(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, bool]:
        """(bytes of the input tensors on this rank, 0 for ``barrier``; whether all are on the CPU)."""
        if len(self.inputs) == 1 and self.label != "barrier":  # most ops: one input argument
            value = self._argument(self.inputs[0], args, kwargs)
            if type(value) is list and len(value) == 1:  # allreduce_'s [tensor]
                value = value[0]
            if type(value) is torch.Tensor:
                return value.numel() * value.element_size(), value.device.type == "cpu"
            return _tensor_bytes(value)
        nbytes, on_cpu = 0, True
        for where in self.inputs:
            size, cpu = _tensor_bytes(self._argument(where, args, kwargs))
            nbytes += size
            on_cpu = on_cpu and cpu
        return (0 if self.label == "barrier" else nbytes), on_cpu

    def process_group(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any | None:
        """The call's ``ProcessGroup`` (``None`` if absent)."""
        group = self._argument(self.group, args, kwargs)
        if isinstance(group, torch.ScriptObject):
            return torch._C._distributed_c10d.ProcessGroup.unbox(group)
        return group


def find_work(out: Any) -> Any | None:
    """The ``Work`` a ``c10d`` op returns (alone or in its result tuple), else ``None``."""
    for leaf in out if isinstance(out, tuple) else (out,):
        if isinstance(leaf, torch.ScriptObject):
            return torch._C._distributed_c10d.Work.unbox(leaf)
    return None


def completion_future(work: Any) -> Any | None:
    """The ``Work``'s future, or ``None`` where it has none (gloo ``reduce_scatter`` in 2.13)."""
    try:
        return work.get_future()
    except RuntimeError:  # "Work::getFuture not implemented"
        return None


class CollectiveIssuer(Protocol):
    """Who the kernels hand each collective call to (``CollectiveCounter``)."""

    def issue(
        self, spec: OpSpec, keyset: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Issue the call with ``spec.op.redispatch(keyset, *args, **kwargs)``, return its result."""


#: Dispatch keys below ``BackendSelect``: where the kernels hand the op on.
_BELOW_BACKEND_SELECT = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)


class _Nesting(threading.local):
    depth = 0  # > 0 while this thread is inside an issued op (ops it issues are handed on)


class CollectiveKernels:
    """Python kernels at ``BackendSelect`` for the ops of :data:`OP_LABELS` (process-wide).

    A call goes to the active :class:`CollectiveIssuer` when it is made on
    the thread that activated it or on an autograd thread running a
    backward pass (the GPU's device threads, where FSDP2 reduce-scatters);
    every other call is handed straight on: calls while nobody observes,
    calls from other threads (``dcp.async_save``'s background collectives,
    trainer/checkpoint/checkpointer.py), and calls made inside an observed one (no op is
    seen twice).
    """

    def __init__(self) -> None:
        # (issuer, id of the thread that activated it), swapped as one value
        self._observing: tuple[CollectiveIssuer, int] | None = None
        self._nesting = _Nesting()
        self._library: Library | None = None
        self._lock = threading.Lock()

    @property
    def active(self) -> CollectiveIssuer | None:
        """The issuer collective calls go to; ``None``: nobody observes."""
        observing = self._observing
        return None if observing is None else observing[0]

    def activate(self, issuer: CollectiveIssuer | None) -> tuple[CollectiveIssuer, int] | None:
        """Send this thread's collective calls to ``issuer`` (``None``: nobody); return the
        previous state, for :meth:`restore`. Installs the kernels on first use."""
        if issuer is not None:
            self.install()
        previous = self._observing
        self._observing = None if issuer is None else (issuer, threading.get_ident())
        return previous

    def restore(self, previous: tuple[CollectiveIssuer, int] | None) -> None:
        """Go back to what :meth:`activate` returned."""
        self._observing = previous

    def install(self) -> None:
        """Register the kernels (once per process; later calls do nothing)."""
        with self._lock:
            if self._library is not None:
                return
            library = Library("c10d", "IMPL")
            for packet, label in OP_LABELS.items():
                for overload in packet.overloads():
                    spec = OpSpec.of(getattr(packet, overload), label)
                    library.impl(spec.op, self._kernel(spec), "BackendSelect", with_keyset=True)
            self._library = library

    def uninstall(self) -> None:
        """Remove the kernels while nobody observes (``benchmarks/trainer_bench.py``: its bare
        baseline runs in the same processes as the counting variants)."""
        with self._lock:
            if self._library is not None and self._observing is None:
                self._library._destroy()
                self._library = None

    def _kernel(self, spec: OpSpec) -> Callable[..., Any]:
        nesting = self._nesting
        below = _BELOW_BACKEND_SELECT
        redispatch = spec.op.redispatch
        thread_id = threading.get_ident
        graph_task = torch._C._current_graph_task_id  # -1 outside a backward pass

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            observing = self._observing
            if (
                observing is None
                or nesting.depth
                or (observing[1] != thread_id() and graph_task() < 0)
            ):
                return redispatch(keyset & below, *args, **kwargs)
            nesting.depth += 1
            try:
                return observing[0].issue(spec, keyset & below, args, kwargs)
            finally:
                nesting.depth -= 1

        return kernel


#: The process's kernels (the dispatcher is process-wide).
KERNELS = CollectiveKernels()

__all__ = [
    "KERNELS",
    "OP_LABELS",
    "CollectiveIssuer",
    "CollectiveKernels",
    "OpSpec",
    "completion_future",
    "find_work",
]
