"""The control channel: fault points fire on the armed rank (and attempt) and disarm at expiry.

The files are written with the tests' shared helper (``arm_control_file``,
tests/trainer/conftest.py), as the agent and the platforms write them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stormwatch.faults.control_file import control_path
from stormwatch.trainer.control import ControlChannel
from stormwatch.trainer.errors import ControlFileError, InjectedFault


class FakeTime:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


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


def test_each_point_fires_only_on_the_armed_rank(tmp_path, arm_control_file):
    fake = FakeTime()
    arm_control_file(
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


def test_points_disarm_at_expiry_and_when_the_file_goes(tmp_path, arm_control_file):
    fake, fired = FakeTime(now=1000.0), []
    path = arm_control_file(
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
    arm_control_file(tmp_path, 0, {"point": "slow_step", "seconds": 1.0})
    assert channel.poll().points == {"slow_step"}
    path.unlink()
    assert not channel.poll().points


def test_a_hang_blocks_until_it_expires(tmp_path, arm_control_file):
    fake, fired = FakeTime(now=1000.0), []
    arm_control_file(
        tmp_path, 0, {"point": "collective_hang", "op": "all_gather", "expires_at": 1002.0}
    )
    channel = _channel(tmp_path, 0, fake, fired)
    assert channel.poll().touches_collectives
    channel.before_collective("all_reduce", "dp")  # not the hung op
    assert fake.now == 1000.0
    channel.before_collective("all_gather", "dp")
    assert fake.now >= 1002.0 and fired == ["collective_hang"]


def test_a_hang_ends_as_soon_as_its_entry_is_removed(tmp_path, arm_control_file):
    fake, fired = FakeTime(now=1000.0), []
    path = arm_control_file(tmp_path, 0, {"point": "collective_hang", "expires_at": 1100.0})

    def sleep(seconds: float) -> None:
        fake.sleep(seconds)
        if fake.now >= 1001.0 and path.exists():
            path.unlink()  # the entry removed, as the agent's revert does

    channel = ControlChannel(path, clock=fake.clock, sleep=sleep, on_fire=fired.append)
    channel.poll()
    channel.before_collective("all_reduce", "dp")
    assert 1001.0 <= fake.now < 1002.0 and fired == ["collective_hang"]


def test_a_bad_file_raises_once_and_arms_nothing(tmp_path, arm_control_file):
    fake, fired = FakeTime(), []
    control_path(tmp_path, 0).write_text('{"faults": [{"point": "slow_step", "seconds": -1}]}')
    channel = _channel(tmp_path, 0, fake, fired)
    with pytest.raises(ControlFileError, match=r"rank0\.json"):
        channel.poll()
    assert not channel.poll().points  # same content: ignored quietly
    arm_control_file(tmp_path, 0, {"point": "no_such_point"})
    with pytest.raises(ControlFileError):
        channel.poll()


# --------------------------------------------- the points that crash a rank (tests, chaos)
class Killed(Exception):
    """Stands in for the SIGKILL the channel sends its own process."""


def _kill() -> None:
    raise Killed


def _armed_points(channel: ControlChannel) -> tuple:
    armed = channel.poll()
    return (armed.kill_steps, armed.slow_seconds, armed.checkpoint_kills)


_NOTHING = (frozenset(), 0.0, frozenset())
_KILL_6 = {"point": "kill_at_step", "step": 6, "attempt": 0}
_SLOW = {"point": "slow_step", "seconds": 0.5}
_SAVE_KILL = {"point": "checkpoint_kill", "phase": "before_marker", "step": 4, "attempt": 0}


@pytest.mark.parametrize(
    ("files", "rank", "attempt", "expected"),
    [
        ({}, 0, 0, _NOTHING),
        ({r: [_KILL_6] for r in range(4)}, 2, 0, (frozenset({6}), 0.0, frozenset())),
        ({r: [_KILL_6] for r in range(4)}, 2, 1, _NOTHING),  # first attempt only
        ({1: [_KILL_6]}, 2, 0, _NOTHING),  # only rank 1's file arms it
        ({1: [_SLOW]}, 1, 3, (frozenset(), 0.5, frozenset())),  # every attempt
        (
            {r: [_SAVE_KILL] for r in range(4)},
            0,
            0,
            (frozenset(), 0.0, frozenset({("before_marker", 4)})),
        ),
        ({r: [_SAVE_KILL] for r in range(4)}, 0, 1, _NOTHING),
    ],
)
def test_fault_points_apply_to_the_chosen_rank_and_attempt(
    tmp_path, arm_control_file, files, rank, attempt, expected
):
    for armed_rank, entries in files.items():
        arm_control_file(tmp_path, armed_rank, *entries)
    channel = ControlChannel(control_path(tmp_path, rank), attempt=attempt)
    assert _armed_points(channel) == expected


def test_kill_at_step_fires_at_the_start_of_its_step_from_a_file_written_before_the_job(
    tmp_path, arm_control_file
):
    arm_control_file(tmp_path, 0, {"point": "kill_at_step", "step": 1, "attempt": 0})
    fired = []
    channel = ControlChannel(control_path(tmp_path, 0), kill=_kill, on_fire=fired.append)
    channel.poll()  # the loop polls before anything of step 1 runs
    with pytest.raises(Killed):
        channel.check_step(1)
    assert fired == ["kill_at_step"]
    channel.check_step(2)  # another step: nothing


def test_checkpoint_kill_fires_at_its_phase_of_its_step_only(tmp_path, arm_control_file):
    arm_control_file(tmp_path, 0, _SAVE_KILL)
    channel = ControlChannel(control_path(tmp_path, 0), kill=_kill)
    channel.poll()
    channel.checkpoint_phase("before_shards", 4)
    channel.checkpoint_phase("before_marker", 2)
    with pytest.raises(Killed):
        channel.checkpoint_phase("before_marker", 4)


def test_a_kill_step_must_be_an_integer(tmp_path, arm_control_file):
    arm_control_file(tmp_path, 0, {"point": "kill_at_step", "step": "soon"})
    with pytest.raises(ControlFileError) as caught:
        ControlChannel(control_path(tmp_path, 0)).poll()
    assert "kill_at_step" in str(caught.value) and "step" in str(caught.value)


@pytest.mark.parametrize(
    "entry",
    [
        {"point": "checkpoint_kill", "phase": "before_lunch", "step": 4},
        {"point": "checkpoint_kill", "phase": "before_marker"},
        {"point": "checkpoint_kill", "phase": "before_marker", "step": 0},
    ],
)
def test_checkpoint_kill_names_the_phases(tmp_path, arm_control_file, entry):
    arm_control_file(tmp_path, 0, entry)
    with pytest.raises(ControlFileError) as caught:
        ControlChannel(control_path(tmp_path, 0)).poll()
    assert "before_shards, before_metadata, before_marker" in str(caught.value)


def _recording(tmp_path: Path, fake: FakeTime, attempt: int = 0) -> tuple[ControlChannel, list]:
    """A channel whose kill and freeze are recorded instead of done."""
    done: list = []
    channel = ControlChannel(
        control_path(tmp_path, 3),
        attempt=attempt,
        clock=fake.clock,
        sleep=fake.sleep,
        kill=lambda: done.append("SIGKILL"),
        freeze=lambda seconds: done.append(("SIGSTOP", seconds)),
        on_fire=done.append,
    )
    return channel, done


def test_stage_points_fire_at_the_start_of_their_stage_only(tmp_path, arm_control_file):
    fake = FakeTime()
    arm_control_file(
        tmp_path,
        3,
        {"point": "stage_kill", "stage": "mesh"},
        {"point": "stage_freeze", "stage": "parallelize", "seconds": 8},
        {"point": "stage_hang", "stage": "checkpoint_load", "expires_at": 1002.0},
        {"point": "stage_kill", "stage": "rendezvous", "attempt": 1},  # another attempt
    )
    channel, done = _recording(tmp_path, fake)
    channel.stage("rendezvous")
    assert done == []
    channel.stage("mesh")
    assert done == ["stage_kill", "SIGKILL"]
    channel.stage("parallelize")
    assert done[2:] == ["stage_freeze", ("SIGSTOP", 8.0)]
    channel.stage("checkpoint_load")  # blocks until the entry expires
    assert done[4:] == ["stage_hang"] and fake.now >= 1002.0


def test_a_stage_hang_ends_when_its_entry_is_removed(tmp_path, arm_control_file):
    fake = FakeTime()
    arm_control_file(tmp_path, 3, {"point": "stage_hang", "stage": "mesh"})
    channel, done = _recording(tmp_path, fake)
    sleep = fake.sleep

    def revert_after_a_second(seconds: float) -> None:
        sleep(seconds)
        if fake.now >= 1001.0:
            control_path(tmp_path, 3).unlink(missing_ok=True)

    channel._sleep = revert_after_a_second
    channel.stage("mesh")
    assert done == ["stage_hang"] and 1001.0 <= fake.now < 1002.0


def test_freeze_at_step_stops_the_rank_at_the_start_of_its_step(tmp_path, arm_control_file):
    arm_control_file(tmp_path, 3, {"point": "freeze_at_step", "step": 2, "attempt": 0})
    channel, done = _recording(tmp_path, FakeTime())
    channel.poll()
    channel.check_step(1)
    assert done == []
    channel.check_step(2)
    assert done == ["freeze_at_step", ("SIGSTOP", None)]
    other, done_later = _recording(tmp_path, FakeTime(), attempt=1)
    other.poll()
    other.check_step(2)
    assert done_later == []


def test_a_frozen_process_is_resumed_after_its_seconds(tmp_path):
    """The real freeze: SIGSTOP, and SIGCONT from the helper it started."""
    code = (
        "import time; from stormwatch.trainer.control import _freeze_self; "
        "t = time.monotonic(); _freeze_self(1.0); print(round(time.monotonic() - t, 1))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert 0.9 <= float(done.stdout) < 30
