"""The chaos control channel: fault points fire on the armed rank and disarm at expiry."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stormwatch.trainer.control import (
    ControlChannel,
    ControlFileError,
    InjectedFault,
    control_path,
)


class FakeTime:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _arm(directory: Path, rank: int, *faults: dict) -> Path:
    path = control_path(directory, rank)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"faults": list(faults)}))
    os.replace(tmp, path)
    stamp = path.stat().st_mtime_ns + 1_000_000  # a rewrite within one mtime tick still counts
    os.utime(path, ns=(stamp, stamp))
    return path


def _channel(tmp_path: Path, rank: int, fake: FakeTime, fired: list[str]) -> ControlChannel:
    return ControlChannel(
        control_path(tmp_path, rank), clock=fake.clock, sleep=fake.sleep, on_fire=fired.append
    )


def test_without_a_file_nothing_is_armed_and_nothing_fires(tmp_path):
    fake, fired = FakeTime(), []
    channel = _channel(tmp_path, 0, fake, fired)
    armed = channel.poll()
    assert not armed.points and not armed.touches_collectives
    channel.check_step(1)
    channel.slow_step()
    channel.before_collective("all_reduce", "tp")
    assert fired == [] and fake.slept == []
    assert not ControlChannel(None).poll().points  # channel off


def test_each_point_fires_only_on_the_armed_rank(tmp_path):
    fake = FakeTime()
    _arm(
        tmp_path,
        1,
        {"point": "slow_step", "seconds": 0.5},
        {"point": "collective_delay", "seconds": 0.25, "op": "all_reduce", "mesh_dim": "tp"},
        {"point": "error_at_step", "step": 3},
        {"point": "checkpoint_now", "requested_at": 999.0},
    )
    fired0, fired1 = [], []
    rank0, rank1 = _channel(tmp_path, 0, fake, fired0), _channel(tmp_path, 1, fake, fired1)
    for channel in (rank0, rank1):
        channel.poll()
        channel.check_step(2)
        channel.slow_step()
        channel.before_collective("all_reduce", "tp")
        channel.before_collective("all_reduce", "dp")  # other mesh dimension: no delay
        channel.before_collective("all_gather", "tp")  # other op: no delay
    assert fired0 == [] and not rank0.checkpoint_wanted(None)
    assert fired1 == ["slow_step", "collective_delay"]
    assert fake.slept == [0.5, 0.25]
    assert rank1.checkpoint_wanted(None) and rank1.checkpoint_wanted(998.0)
    assert not rank1.checkpoint_wanted(999.5)  # a save started after the request satisfies it
    with pytest.raises(InjectedFault, match="step 3"):
        rank1.check_step(3)
    assert fired1[-1] == "error_at_step"


def test_points_disarm_at_expiry_and_when_the_file_goes(tmp_path):
    fake, fired = FakeTime(now=1000.0), []
    path = _arm(
        tmp_path,
        0,
        {"point": "slow_step", "seconds": 1.0, "expires_at": 1010.0},
        {"point": "collective_delay", "seconds": 0.5, "expires_at": 1005.0},
    )
    channel = _channel(tmp_path, 0, fake, fired)
    assert channel.poll().points == {"slow_step", "collective_delay"}
    fake.now = 1005.0
    assert channel.poll().points == {"slow_step"}  # the delay expired
    assert not channel.poll().touches_collectives
    fake.now = 1010.0
    assert not channel.poll().points
    channel.slow_step()
    assert fired == []
    _arm(tmp_path, 0, {"point": "slow_step", "seconds": 1.0})
    assert channel.poll().points == {"slow_step"}
    path.unlink()
    assert not channel.poll().points


def test_a_hang_blocks_until_it_expires(tmp_path):
    fake, fired = FakeTime(now=1000.0), []
    _arm(tmp_path, 0, {"point": "collective_hang", "op": "all_gather", "expires_at": 1002.0})
    channel = _channel(tmp_path, 0, fake, fired)
    assert channel.poll().touches_collectives
    channel.before_collective("all_reduce", "dp")  # not the hung op
    assert fake.now == 1000.0
    channel.before_collective("all_gather", "dp")
    assert fake.now >= 1002.0 and fired == ["collective_hang"]


def test_a_hang_ends_as_soon_as_its_entry_is_removed(tmp_path):
    fake, fired = FakeTime(now=1000.0), []
    path = _arm(tmp_path, 0, {"point": "collective_hang", "expires_at": 1100.0})

    def sleep(seconds: float) -> None:
        fake.sleep(seconds)
        if fake.now >= 1001.0 and path.exists():
            path.unlink()  # the entry removed, as the agent's revert does

    channel = ControlChannel(path, clock=fake.clock, sleep=sleep, on_fire=fired.append)
    channel.poll()
    channel.before_collective("all_reduce", "dp")
    assert 1001.0 <= fake.now < 1002.0 and fired == ["collective_hang"]


def test_a_bad_file_raises_once_and_arms_nothing(tmp_path):
    fake, fired = FakeTime(), []
    control_path(tmp_path, 0).write_text('{"faults": [{"point": "slow_step", "seconds": -1}]}')
    channel = _channel(tmp_path, 0, fake, fired)
    with pytest.raises(ControlFileError, match=r"rank0\.json"):
        channel.poll()
    assert not channel.poll().points  # same content: ignored quietly
    _arm(tmp_path, 0, {"point": "no_such_point"})
    with pytest.raises(ControlFileError):
        channel.poll()
