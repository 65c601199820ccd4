"""A save cut short by a stop request (SIGTERM: the trainer raises Terminated) is not a
failed save. The 30-minute soak (2026-12-05) caught it: its planned restart landed in the
save of step 700, both ranks logged ``checkpoint_failed`` ("failed: Terminated: received
signal SIGTERM"), and StormwatchCheckpointFailing fired for 15 minutes on a fault-free job.

Real DCP: a sync ``dcp.save`` whose storage writer is interrupted the way the trainer's
SIGTERM handler interrupts a save (Terminated raised on the saving thread), and DCP's own
``CheckpointException`` wrapping it as a collective save reports a rank's failure."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from stormwatch.trainer.checkpoint.checkpointer import _reraise_stop
from stormwatch.trainer.errors import Terminated


class _StoppedWriter(dcp.FileSystemWriter):
    """Writes nothing: SIGTERM arrives while the shards are written."""

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        raise Terminated("received signal SIGTERM")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_stop_inside_dcp_save_is_raised_as_the_stop_not_as_a_save_failure(
    tmp_path: Path,
) -> None:
    state = {"w": torch.ones(4)}
    with pytest.raises(CheckpointException) as caught:  # DCP wraps what the writer raised
        dcp.save(state, storage_writer=_StoppedWriter(str(tmp_path / "ck")))
    with pytest.raises(Terminated, match="SIGTERM"):
        _reraise_stop(caught.value)


def test_dcp_s_wrapped_stop_is_unwrapped_and_other_failures_are_left_to_count() -> None:
    stop = Terminated("received signal SIGTERM")
    wrapped = CheckpointException(
        "save failed",
        {1: (stop, traceback.extract_stack())},  # type: ignore[dict-item]
    )
    with pytest.raises(Terminated) as raised:
        _reraise_stop(wrapped)
    assert raised.value is stop
    disk = CheckpointException(
        "save failed",
        {0: (OSError(28, "No space left on device"), traceback.extract_stack())},  # type: ignore[dict-item]
    )
    _reraise_stop(disk)  # a real failure: returns, and the caller counts it
    _reraise_stop(OSError(28, "No space left on device"))
