"""The benchmark's "bare" trainer: a disabled collective counter observes nothing and changes nothing."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.distributed as dist

from stormwatch.telemetry.comms import CollectiveCounter


class Sink:
    def __init__(self) -> None:
        self.issued: collections.Counter[str] = collections.Counter()

    def on_issue(self, op: str, nbytes: int) -> None:
        self.issued[op] += 1

    def on_complete(self, op: str, seconds: float, ago: float = 0.0) -> None:
        pass

    def on_error(self, where: str, exc: BaseException) -> None:
        raise AssertionError(f"{where}: {exc}")


@pytest.mark.parametrize("enabled", [True, False])
def test_the_counter_sees_collectives_only_when_enabled(one_rank_group, enabled) -> None:
    sink = Sink()
    tensor = torch.ones(8)
    counter = CollectiveCounter(sink, enabled=enabled)
    with counter:
        assert counter.observing is enabled  # disabled: no kernel sends it anything
        dist.all_reduce(tensor)
    assert tensor.tolist() == [1.0] * 8  # the collective ran either way
    assert sink.issued == (collections.Counter(all_reduce=1) if enabled else collections.Counter())
    assert (counter.take_wait_seconds() > 0) is enabled
