"""Count the collectives a training step really issues, at a cost per collective, not per op.

:class:`CollectiveCounter` observes the ``c10d`` collective ops through
Python kernels registered on those ops alone
(:mod:`stormwatch.telemetry.collective_ops`, which also says why this and not
a dispatch mode, a function mode or the flight recorder): FSDP2's
all-gathers and reduce-scatters, DTensor's functional collectives, the
pipeline's ``send``/``recv`` and our own ``all_reduce``; no other op enters
Python.

Per collective the counter reports to a :class:`CollectiveSink`:

* ``op``: a stable label from :data:`OP_LABELS` (``all_gather``,
  ``reduce_scatter``, ``all_reduce``, ``send``, ``recv``, ...), whatever API
  issued it;
* bytes: total size of the op's *input* tensors on this rank (for
  ``all_gather`` this rank's shard, for ``reduce_scatter`` the full
  unreduced buffer, for ``all_reduce``/``broadcast`` the tensor, for the
  pipeline's point-to-point ``send``/``recv`` the tensor sent or the buffer
  received into, e.g. one micro-batch's activations ``[mb, seq, d_model]``); 0
  for ``barrier``;
* time, in seconds: wall time from issuing the op until it is seen complete.
  Collectives are asynchronous (FSDP2 overlaps them with compute). On the
  CPU (gloo) the ``Work``'s future completes when the transfer has finished,
  on gloo's thread; its callback only notes the time, which is reported on
  the training thread at the next collective or when the counter is left. A
  functional collective is timed by the ``Work`` of the ``c10d`` op it
  issues (the transfer), not by when its ``wait_tensor`` runs. Where there
  is no such future (gloo's ``reduce_scatter``, whose ``Work``
  never reports completion in torch 2.13; NCCL, whose future completes when
  the kernel is enqueued), ``Work.is_completed()`` is polled at every later
  collective and when the counter is left; leaving it is a sync point (the
  step ends with ``loss.item()`` after every collective was waited for), so
  an op still not reporting completion then is timed by how long its
  issuing call took, a lower bound. On the GPU the resolution is therefore
  the gap between collectives, not the gap between ops as with the former
  dispatch mode. Times of overlapping collectives overlap, so their sum can
  exceed the step time.

Besides the per-op sink, the counter can label each collective with the
mesh dimension of its process group (``groups``: process-group name ->
``"pp"``/``"dp_replicate"``/``"dp_shard"``/``"tp"``; other groups are
``"world"`` for the default group, else ``"other"``) and hand a
:class:`CollectiveRecord` (op, mesh dimension, group size, bytes, issue and
completion time) to a :class:`CollectiveObserver`. It also keeps, per step,
the wall time during which at least one collective was in flight
(:meth:`CollectiveCounter.take_wait_seconds`, the union of the
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
from typing import Any, NamedTuple, Protocol

from stormwatch.telemetry.collective_ops import (
    KERNELS,
    OP_LABELS,
    OpSpec,
    completion_future,
    find_work,
)

#: Completed intervals kept for :meth:`CollectiveCounter.take_wait_seconds`; beyond this
#: many they are folded into their union (an overlap across two folds counts twice).
_MAX_INTERVALS = 4096


class CollectiveSink(Protocol):
    """Receives what :class:`CollectiveCounter` observes (on the threads that
    dispatch ops: the training thread and, on GPU, autograd's device threads)."""

    def on_issue(self, op: str, nbytes: int) -> None:
        """One collective ``op`` was issued with ``nbytes`` input bytes."""

    def on_complete(self, op: str, seconds: float, ago: float = 0.0) -> None:
        """A collective ``op`` took ``seconds`` from issue to its observed completion, which
        is known to have happened no later than ``ago`` seconds before this call (0: just
        now; more when the completion was noticed late, e.g. by a poll from another thread
        while the rank hangs: a heartbeat must not move to the time of the noticing)."""

    def on_error(self, where: str, exc: BaseException) -> None:
        """Bookkeeping failed (the collective itself was not affected)."""


class CollectiveRecord(NamedTuple):
    """One observed collective (a named tuple: made for every collective, ~0.3 us).

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


class _Issued:
    """One counted collective, from issue until it is reported complete."""

    __slots__ = (
        "call_seconds",
        "clock",
        "ended",
        "group_size",
        "issued_at",
        "label",
        "mesh_dim",
        "nbytes",
        "pending_seen",
        "seconds",
        "seq",
        "start",
    )

    def __init__(
        self, seq: int, label: str, mesh_dim: str, group_size: int, nbytes: int, start: float
    ) -> None:
        self.seq, self.label, self.mesh_dim, self.group_size = seq, label, mesh_dim, group_size
        self.nbytes, self.start = nbytes, start
        self.issued_at = 0.0  # Unix time
        self.call_seconds = 0.0
        self.clock: Callable[[], float] = time.perf_counter
        self.ended: float | None = None  # set by the future's callback (gloo's thread)
        # Counter-clock time it was last seen not complete (a polled op's completion lies
        # after this, and is only known to lie before the poll that saw it complete).
        self.pending_seen = start
        self.seconds: float | None = None  # set once reported complete

    def finished(self, _future: Any) -> None:
        """Callback of the op's future, on the backend's thread: note the time only."""
        self.ended = self.clock()


class CollectiveCounter:
    """Reports every collective issued while it is entered to ``sink`` (see module docstring).

    Use as a context manager around the code to observe (one training step)::

        with CollectiveCounter(sink):
            loss = train_step(...)

    It observes the collectives issued by the thread that entered it and by
    autograd's threads during a backward pass, not those of other threads
    (``dcp.async_save``'s background saves). One counter observes at a time:
    entering one while another is entered hands the observation to the inner
    one until it exits.

    Args:
        sink: receives counts, bytes and completion times.
        clock: monotonic clock in seconds (default :func:`time.perf_counter`).
        groups: process-group name -> mesh dimension label (``"dp_shard"``, ``"tp"``, ...);
            see :meth:`ParallelDims.group_names`. Other groups are labelled
            ``"world"`` (the default group) or ``"other"``.
        observer: receives a :class:`CollectiveRecord` per completed collective.
        recent: how many of the latest collectives :meth:`recent` keeps (for
            the per-rank hang dump, :mod:`stormwatch.telemetry.dump`).
        enabled: ``False`` makes entering the counter a no-op (no kernel
            installed, nothing observed, :meth:`take_wait_seconds` returns 0):
            the "bare" trainer of ``benchmarks/trainer_bench.py``.
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
        self.enabled = enabled
        self._sink = sink
        self._clock = clock
        self._groups = dict(groups or {})
        self._observer = observer
        self._group_cache: dict[str, tuple[str, int]] = {}
        # ops without a completion future (gloo reduce_scatter, NCCL), not yet seen complete
        self._works: list[tuple[Any, _Issued]] = []
        # ops with a completion future, not yet reported complete
        self._open: list[_Issued] = []
        # (start, end) of the collectives completed since take_wait_seconds()
        self._intervals: list[tuple[float, float]] = []
        # seconds of intervals folded early (a job that never takes its wait: no step marks)
        self._folded = 0.0
        self._lock = threading.Lock()
        self._seq = 0
        self._recent: collections.deque[_Issued] = collections.deque(maxlen=recent)
        self._outer: tuple[Any, int] | None = None  # KERNELS state to restore on exit
        #: Called as ``interceptor(op, mesh_dim)`` before each collective is
        #: issued, on the issuing thread; ``None`` (the default) costs nothing.
        #: Set by the training loop while a collective fault point is armed.
        self.interceptor: Callable[[str, str], None] | None = None

    def label_groups(self, groups: Mapping[str, str]) -> None:
        """Add process-group name -> mesh dimension labels (for collectives issued from now)."""
        with self._lock:
            self._groups.update(groups)
            self._group_cache.clear()

    @property
    def observing(self) -> bool:
        """True while this counter is entered (and enabled): collectives are reported to it."""
        return KERNELS.active is self

    def __enter__(self) -> CollectiveCounter:
        if self.enabled:
            self._outer = KERNELS.activate(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.enabled:
            return
        KERNELS.restore(self._outer)
        self._outer = None
        if exc_info[0] is None:
            self.poll(final=True)
        else:  # the step failed: what is pending may never complete
            with self._lock:
                self._works.clear()
                self._open.clear()

    def recent(self) -> list[dict[str, Any]]:
        """The latest collectives, oldest first, as JSON-ready dicts.

        Keys: ``seq`` (issue order in this process, from 1), ``op``,
        ``mesh_dim``, ``group_size``, ``nbytes``, ``issued_at`` (Unix time),
        ``seconds`` (issue to observed completion; ``None`` while pending).
        """
        with self._lock:
            issued = list(self._recent)
        return [
            {
                "seq": op.seq,
                "op": op.label,
                "mesh_dim": op.mesh_dim,
                "group_size": op.group_size,
                "nbytes": op.nbytes,
                "issued_at": op.issued_at,
                "seconds": op.seconds,
            }
            for op in issued
        ]

    def take_wait_seconds(self) -> float:
        """Seconds during which at least one collective was in flight, since the last call.

        Call it once per step, after leaving the counter: it is the step's
        collective wait (union of issue-to-completion intervals, so overlapping
        collectives count once).
        """
        with self._lock:
            intervals, self._intervals = self._intervals, []
            folded, self._folded = self._folded, 0.0
        return folded + union_seconds(intervals)

    def poll(self, *, final: bool = False) -> None:
        """Report the collectives seen complete since the last call (on the calling thread).

        Called before every counted op and when the counter is left.

        Args:
            final: the caller knows every issued op has completed (end of a
                step): ops that never report completion get their call time,
                ops whose future callback has not run yet the current time.
        """
        if not (self._works or self._open):
            return
        try:
            now = self._clock()
            # (op, its end for the latency, the latest time it is known to have completed by)
            done: list[tuple[_Issued, float, float]] = []
            with self._lock:
                waiting: list[_Issued] = []
                for issued in self._open:
                    ended = issued.ended
                    if ended is not None:
                        done.append((issued, ended, ended))
                    elif final:  # completed (the step waited for it), callback still to come
                        done.append((issued, now, now))
                    else:
                        waiting.append(issued)
                self._open = waiting
                still: list[tuple[Any, _Issued]] = []
                for work, issued in self._works:
                    if work.is_completed():  # at some time since it was last seen pending
                        done.append((issued, now, issued.pending_seen))
                    elif final:
                        end = issued.start + issued.call_seconds
                        done.append((issued, end, end))
                    else:
                        issued.pending_seen = now
                        still.append((work, issued))
                self._works = still
                if done:  # their intervals, in the same section
                    intervals = self._intervals
                    for issued, end, _ in done:
                        issued.seconds = end - issued.start
                        intervals.append((issued.start, end))
                    if len(intervals) > _MAX_INTERVALS:  # bounded memory without step marks
                        self._folded += union_seconds(intervals)
                        self._intervals = []
            for issued, end, known in done:
                self._completed(issued, end, max(0.0, now - known))
        except Exception as exc:
            self._sink.on_error("collectives", exc)

    def _completed(self, issued: _Issued, end: float, ago: float) -> None:
        """Report one completed op (its interval is recorded by :meth:`poll`)."""
        self._sink.on_complete(issued.label, end - issued.start, ago)
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

    def issue(
        self, spec: OpSpec, keyset: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Issue one counted op (called by its kernel, on the issuing thread: ``CollectiveIssuer``)."""
        self.poll()
        start = self._clock()
        hook = self.interceptor
        if hook is not None:  # a chaos fault point is armed (stormwatch.trainer.control)
            hook(spec.label, self._mesh_dim_or_other(spec, args, kwargs))
        out = spec.op.redispatch(keyset, *args, **kwargs)
        self._issued(spec, start, self._clock() - start, args, kwargs, out)
        return out

    def _mesh_dim_or_other(
        self, spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> str:
        try:
            return self._group(spec, args, kwargs)[0]
        except Exception as exc:
            self._sink.on_error("collectives", exc)
            return "other"

    def _group(
        self, spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, int]:
        """(mesh dimension label, group size) of the op's process group."""
        group = spec.process_group(args, kwargs)
        if group is None:
            return "other", 1
        name = group.group_name
        cached = self._group_cache.get(name)
        if cached is not None:
            return cached
        import torch.distributed as dist

        world = dist.group.WORLD if dist.is_initialized() else None
        dim = self._groups.get(name)
        if dim is None:
            dim = "world" if world is not None and world.group_name == name else "other"
        cached = (dim, group.size())
        self._group_cache[name] = cached
        return cached

    def _issued(
        self,
        spec: OpSpec,
        start: float,
        call_seconds: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
    ) -> None:
        try:
            nbytes, on_cpu = spec.input_bytes(args, kwargs)
            label = spec.label
            self._sink.on_issue(label, nbytes)
            mesh_dim, size = self._group(spec, args, kwargs)
            issued_at = time.time() - (self._clock() - start)
            work = find_work(out)
            # A gloo future completes with the transfer (on gloo's thread); an
            # NCCL one as soon as the kernel is enqueued: on the GPU, poll.
            future = completion_future(work) if work is not None and on_cpu else None
            with self._lock:  # one section: the sequence, the recent ring, the pending list
                self._seq += 1
                issued = _Issued(self._seq, label, mesh_dim, size, nbytes, start)
                issued.call_seconds = call_seconds
                issued.issued_at = issued_at
                self._recent.append(issued)
                if future is not None:
                    issued.clock = self._clock
                    self._open.append(issued)
                elif work is not None:
                    self._works.append((work, issued))
            if future is not None:
                future.add_done_callback(issued.finished)
        except Exception as exc:  # never let bookkeeping break a collective
            self._sink.on_error("collectives", exc)


__all__ = [
    "OP_LABELS",
    "CollectiveCounter",
    "CollectiveObserver",
    "CollectiveRecord",
    "CollectiveSink",
    "union_seconds",
]
