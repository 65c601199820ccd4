"""Shared fixtures of the telemetry API's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def one_rank_group() -> Iterator[object]:
    """A one-rank gloo process group (in-memory store) for the test; yields the WORLD group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
