"""The collective counter sees c10d and functional collectives, with op label, bytes and time,
through kernels on the collective ops only (no per-op Python)."""

from __future__ import annotations

import collections
import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.utils._python_dispatch import _get_current_dispatch_mode

from stormwatch.telemetry.comms import OP_LABELS, CollectiveCounter, union_seconds


class RecordingSink:
    def __init__(self, *, fail_on_issue: bool = False) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.bytes: collections.Counter[str] = collections.Counter()
        self.completed: collections.Counter[str] = collections.Counter()
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.ago: dict[str, float] = {}  # op -> the last completion's reported age
        self.errors: list[str] = []
        self._fail = fail_on_issue
        self._lock = threading.Lock()

    def on_issue(self, op: str, nbytes: int) -> None:
        if self._fail:
            raise RuntimeError("sink broken")
        self.calls[op] += 1
        self.bytes[op] += nbytes

    def on_complete(self, op: str, seconds: float, ago: float = 0.0) -> None:
        with self._lock:
            self.completed[op] += 1
            self.seconds[op] += seconds
            self.ago[op] = ago

    def on_error(self, where: str, exc: BaseException) -> None:
        self.errors.append(f"{where}: {exc}")


def test_c10d_collectives_are_counted_with_input_bytes_and_completion(one_rank_group):
    sink = RecordingSink()
    with CollectiveCounter(sink):
        dist.all_reduce(torch.ones(8))  # 32 bytes
        dist.all_gather_single(torch.empty(4), torch.ones(4))  # input: 16 bytes
        dist.reduce_scatter_single(torch.empty(4), torch.ones(4))  # input: 16 bytes
        work = dist.broadcast(torch.ones(2, dtype=torch.float64), src=0, async_op=True)
        work.wait()
        dist.barrier()
    assert dict(sink.calls) == {
        "all_reduce": 1,
        "all_gather": 1,
        "reduce_scatter": 1,
        "broadcast": 1,
        "barrier": 1,
    }
    assert dict(sink.bytes) == {
        "all_reduce": 32,
        "all_gather": 16,
        "reduce_scatter": 16,
        "broadcast": 16,
        "barrier": 0,
    }
    assert sink.completed == sink.calls  # every op timed by the end of the block
    assert all(seconds >= 0 for seconds in sink.seconds.values())
    assert sink.errors == []


def test_fc10_a_completion_noticed_late_is_reported_with_its_age_not_as_progress_now(
    one_rank_group,
):
    # A hung rank's dump polls the counter from another thread long after its last
    # collective completed: that completion must not move the rank's heartbeat to the poll
    # (it hid a Lightning job's hang for a whole stall threshold). gloo's all-reduce has a
    # completion future (its time is known); its reduce-scatter has none (polled: known to
    # have completed by the last time it was seen pending, here its issue).
    sink = RecordingSink()
    for issue in (
        lambda: dist.all_reduce(torch.ones(8), async_op=True),
        lambda: dist.reduce_scatter_single(torch.empty(4), torch.ones(4), async_op=True),
    ):
        with CollectiveCounter(sink) as counter:
            issue().wait()
            time.sleep(0.5)
            counter.poll()  # not final, and no op after it: as the dump thread's poll
    assert set(sink.ago) == {"all_reduce", "reduce_scatter"}, sink.ago
    assert all(ago >= 0.5 for ago in sink.ago.values()), sink.ago


def test_functional_collectives_are_counted_once_through_their_c10d_op(one_rank_group):
    sink = RecordingSink()
    with CollectiveCounter(sink):
        out = funcol.all_reduce(torch.ones(4), "sum", one_rank_group)
        total = (out + 1).sum()  # first use waits on the result
        gathered = funcol.all_gather_single(torch.ones(2), 0, one_rank_group)
        float(gathered.sum())
    assert float(total) == 8.0
    assert dict(sink.calls) == {"all_reduce": 1, "all_gather": 1}  # not twice (funcol + c10d)
    assert dict(sink.bytes) == {"all_reduce": 16, "all_gather": 8}
    assert sink.completed == sink.calls


def test_ops_other_than_collectives_never_enter_python(one_rank_group):
    sink = RecordingSink()
    counter = CollectiveCounter(sink)
    with counter:
        assert counter.observing
        assert _get_current_dispatch_mode() is None  # no dispatch mode: aten ops stay in C++
        dist.all_reduce(torch.ones(2))
    assert not counter.observing
    dist.all_reduce(torch.ones(2))  # outside the block: handed on, not counted
    assert dict(sink.calls) == {"all_reduce": 1}


def test_collectives_of_other_threads_are_not_counted(one_rank_group):
    sink = RecordingSink()
    side = dist.new_group([0])  # like the async checkpoint's own group, used from its thread
    with CollectiveCounter(sink):
        thread = threading.Thread(target=lambda: dist.all_reduce(torch.ones(2), group=side))
        thread.start()
        thread.join()
        dist.broadcast(torch.ones(2), src=0)
    assert dict(sink.calls) == {"broadcast": 1}


def test_the_interceptor_runs_before_each_collective_with_its_op_and_mesh_dim(one_rank_group):
    sink, seen = RecordingSink(), []
    sub = dist.new_group([0])
    counter = CollectiveCounter(sink, groups={sub.group_name: "tp"})
    counter.interceptor = lambda op, mesh_dim: seen.append((op, mesh_dim, sink.calls[op]))
    with counter:
        dist.all_reduce(torch.ones(2), group=sub)
        funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD).wait()
    # called before the op is issued (its count is still 0), once per collective
    assert seen == [("all_reduce", "tp", 0), ("all_reduce", "world", 1)]


def test_a_failed_step_leaves_nothing_pending_and_stops_observing(one_rank_group):
    sink = RecordingSink()
    counter = CollectiveCounter(sink)
    with pytest.raises(RuntimeError, match="step failed"), counter:
        dist.reduce_scatter_single(torch.empty(2), torch.ones(2))  # gloo: never reports completion
        raise RuntimeError("step failed")
    assert not counter.observing and sink.calls["reduce_scatter"] == 1
    with counter:
        pass
    assert sink.completed["reduce_scatter"] == 0  # dropped with the failed step, not timed later


def test_a_failing_sink_never_changes_the_collective(one_rank_group):
    sink = RecordingSink(fail_on_issue=True)
    tensor = torch.full((3,), 2.0)
    with CollectiveCounter(sink):
        dist.all_reduce(tensor)
    assert torch.equal(tensor, torch.full((3,), 2.0))
    assert sink.errors and "sink broken" in sink.errors[0]


def test_non_collective_ops_are_not_counted():
    sink = RecordingSink()
    with CollectiveCounter(sink):
        torch.ones(3).add_(1).sum()
    assert not sink.calls and not sink.errors


def test_every_label_is_a_known_op_name():
    assert set(OP_LABELS.values()) <= {
        "all_gather",
        "reduce_scatter",
        "all_reduce",
        "all_to_all",
        "broadcast",
        "reduce",
        "gather",
        "scatter",
        "barrier",
        "send",
        "recv",
    }
    assert {"all_gather", "reduce_scatter", "all_reduce"} <= set(OP_LABELS.values())


class RecordingObserver:
    def __init__(self) -> None:
        self.records = []

    def on_collective(self, record) -> None:
        self.records.append(record)


def test_collectives_are_labelled_by_mesh_dimension_and_group_size(one_rank_group):
    sink, observer = RecordingSink(), RecordingObserver()
    sub = dist.new_group([0])
    counter = CollectiveCounter(sink, groups={sub.group_name: "tp"}, observer=observer)
    with counter:
        dist.all_reduce(torch.ones(8))  # default group: "world"
        dist.all_reduce(torch.ones(4), group=sub)  # named by the mapping: "tp"
        out = funcol.all_reduce(torch.ones(2), "sum", sub)
        float(out.sum())
    labels = [(r.op, r.mesh_dim, r.group_size, r.nbytes) for r in observer.records]
    assert labels == [
        ("all_reduce", "world", 1, 32),
        ("all_reduce", "tp", 1, 16),
        ("all_reduce", "tp", 1, 8),
    ]
    assert all(r.end >= r.start for r in observer.records)
    assert counter.take_wait_seconds() > 0
    assert counter.take_wait_seconds() == 0  # taken: reset
    assert sink.errors == []


def test_wait_is_the_union_of_overlapping_intervals():
    assert union_seconds([]) == 0
    assert union_seconds([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == pytest.approx(3.0)
    assert union_seconds([(1.0, 2.0), (0.0, 3.0)]) == pytest.approx(3.0)
