"""The trainer's SIGTERM handling: the first SIGTERM raises ``Terminated`` (so the rank
writes its post-mortem dump); a second one, sent while that dump is written (under srun
both slurmstepd and torchrun signal the worker), must not cut it short."""

from __future__ import annotations

import os
import signal
import time

from stormwatch.trainer.errors import Terminated
from stormwatch.trainer.loop import _sigterm_raises


def test_a_second_sigterm_does_not_cut_the_first_ones_dump_short() -> None:
    steps = []
    with _sigterm_raises():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2.0)  # the handler raises here
            steps.append("not interrupted")
        except Terminated:
            steps.append("terminated")
            os.kill(os.getpid(), signal.SIGTERM)  # the second signal, during the "dump"
            time.sleep(0.2)
            steps.append("dump written")
    assert steps == ["terminated", "dump written"]
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back


def test_once_quiet_a_sigterm_neither_raises_nor_kills_so_the_teardown_finishes() -> None:
    """The rank's teardown (the session's last flush) runs with SIGTERM still handled, made
    quiet: torchrun's SIGTERM to a rank already ending killed it mid-flush once the default
    handler was back, and its last step record was lost (cc28's resume test)."""
    steps = []
    with _sigterm_raises() as quiet:
        quiet()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # a raise or the default action would land here
        steps.append("flushed")
    assert steps == ["flushed"]
