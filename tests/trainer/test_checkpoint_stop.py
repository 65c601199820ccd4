"""A save cut short by a stop request (SIGTERM: the trainer raises Terminated), or by a
peer that died or left, is not a failed save. The 30-minute soak (2026-12-05) caught it: its planned restart landed in the
save of step 700, both ranks logged ``checkpoint_failed`` ("failed: Terminated: received
signal SIGTERM"), and StormwatchCheckpointFailing fired for 15 minutes on a fault-free job.

Real DCP: a sync ``dcp.save`` whose storage writer is interrupted the way the trainer's
SIGTERM handler interrupts a save (Terminated raised on the saving thread), and DCP's own
``CheckpointException`` wrapping it as a collective save reports a rank's failure. The lost
peer of a real two-rank job is ``test_checkpoint_peer_lost.py``."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from stormwatch.trainer.checkpoint.checkpointer import _reraise_job_failure
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
        _reraise_job_failure(caught.value)


def test_dcp_s_wrapped_stop_is_unwrapped_and_other_failures_are_left_to_count() -> None:
    stop = Terminated("received signal SIGTERM")
    wrapped = CheckpointException(
        "save failed",
        {1: (stop, traceback.extract_stack())},  # type: ignore[dict-item]
    )
    with pytest.raises(Terminated) as raised:
        _reraise_job_failure(wrapped)
    assert raised.value is stop
    disk = CheckpointException(
        "save failed",
        {0: (OSError(28, "No space left on device"), traceback.extract_stack())},  # type: ignore[dict-item]
    )
    _reraise_job_failure(disk)  # a real failure: returns, and the caller counts it
    _reraise_job_failure(OSError(28, "No space left on device"))


def _wrapped(rank: int, exc: BaseException) -> CheckpointException:
    return CheckpointException("save failed", {rank: (exc, traceback.extract_stack())})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    "lost",
    [
        RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[10.213.0.11]:17334. This is typically caused by a remote worker crashing."
        ),
        RuntimeError("[pair.cc:589] Read error [10.213.0.11]:2375: Connection reset by peer"),
        dist.DistBackendError("NCCL communicator was aborted on rank 0."),
        dist.DistNetworkError("Connection reset by peer"),
    ],
    ids=["gloo-closed", "gloo-reset", "nccl-aborted", "tcp-reset"],
)
def test_a_lost_peer_is_raised_as_the_job_s_failure_not_counted_as_a_failed_save(
    lost: BaseException,
) -> None:
    with pytest.raises(type(lost)) as raised:
        _reraise_job_failure(lost)
    assert raised.value is lost
    with pytest.raises(type(lost)) as raised:
        _reraise_job_failure(_wrapped(0, lost))
    assert raised.value is lost


def test_a_storage_client_s_reset_is_a_failed_save_and_a_chained_gloo_loss_is_the_job_s() -> None:
    """Only gloo's own message says a peer is gone (breaker's finding): a remote-storage
    writer's reset upload is a failed save; a gloo loss raised from is still found."""
    reset = RuntimeError("upload of shard 3 failed: [Errno 104] Connection reset by peer")
    _reraise_job_failure(reset)
    _reraise_job_failure(_wrapped(0, reset))
    gloo = RuntimeError("[pair.cc:553] Connection closed by peer [10.213.0.11]:17334")
    chained = ValueError("the planner's gather failed")
    chained.__cause__ = gloo
    with pytest.raises(RuntimeError) as raised:
        _reraise_job_failure(_wrapped(1, chained))
    assert raised.value is gloo


def test_a_timed_out_save_collective_is_still_a_failed_save() -> None:
    """A peer slow to write (slow storage) times its peers out as a frozen one does."""
    timeout = RuntimeError("[pair.cc:446] Timed out waiting 30000ms for recv operation to complete")
    _reraise_job_failure(timeout)
    _reraise_job_failure(_wrapped(1, timeout))
