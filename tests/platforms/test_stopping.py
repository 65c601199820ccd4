"""Stopping always stops (issue 17, item 3), with real processes: SIGTERM, the grace period,
SIGKILL to what is left, and gone before the call returns; through the one helper
(:mod:`stormwatch.platforms.stopping`) and the lab backend's restart and exclusion, the
responder's actions on a job the lab runs itself."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from stormwatch.platforms import LabBackend, NotStopped
from stormwatch.platforms.stopping import require_gone, running, stop_processes

#: A process that notes SIGTERM and goes on (a rank whose handler cannot run, or ignores it).
IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: None)\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(1)\n"
)
#: A parent that exits on SIGTERM (torchrun) with a child that ignores it (its rank).
PARENT_OF_STUBBORN_CHILD = (
    "import subprocess, sys, time\n"
    f"child = subprocess.Popen([sys.executable, '-c', {IGNORES_SIGTERM!r}], stdout=sys.stdout)\n"
    "print(child.pid, flush=True)\n"
    "while True: time.sleep(1)\n"
)


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``spawn(code, env=None)``: a Python process running ``code`` (killed at the end)."""
    started: list[subprocess.Popen[str]] = []

    def start(code: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_process_that_ignores_sigterm_is_sigkilled_after_the_grace_period_and_gone(
    spawn: Callable[..., subprocess.Popen[str]],
) -> None:
    proc = spawn(IGNORES_SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    target = psutil.Process(proc.pid)
    started = time.monotonic()
    stopped = stop_processes([target], grace_s=1.0)
    took = time.monotonic() - started
    assert stopped.terminated == stopped.killed == (proc.pid,) and stopped.gone
    assert 1.0 <= took < 3.0, took
    assert not running(target)  # (the helper reaped its own child: no exit status is left)
    assert stopped.describe().startswith(
        f"SIGKILL to 1 still running 1 s after SIGTERM (pids [{proc.pid}]); all gone after "
    )


def test_a_process_that_exits_on_sigterm_is_not_sigkilled(
    spawn: Callable[..., subprocess.Popen[str]],
) -> None:
    proc = spawn("import time; print('ready', flush=True); time.sleep(60)")
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    target = psutil.Process(proc.pid)
    stopped = stop_processes([target], grace_s=30.0)
    assert stopped.terminated == (proc.pid,) and stopped.killed == ()
    assert stopped.gone and stopped.seconds < 5.0 and not running(target)


def test_a_child_orphaned_by_its_parents_exit_is_still_sigkilled(
    spawn: Callable[..., subprocess.Popen[str]],
) -> None:
    # torchrun exits on SIGTERM; a rank of it that does not is re-parented away from it:
    # it is found because the whole tree is collected before the first signal.
    parent = spawn(PARENT_OF_STUBBORN_CHILD)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert parent.stdout.readline() == "ready\n"
    tree = [psutil.Process(parent.pid), psutil.Process(child_pid)]
    stopped = stop_processes(tree, grace_s=0.5, term=tree[:1])
    assert stopped.terminated == (parent.pid,) and stopped.killed == (child_pid,)
    assert stopped.gone and not running(tree[1])


def test_require_gone_names_what_is_left() -> None:
    from stormwatch.platforms.stopping import Stopped

    left = Stopped(terminated=(7,), killed=(7,), left=(7,), grace_s=1.0, seconds=6.0)
    with pytest.raises(NotStopped, match=r"the workers of job j: pids \[7\] still running 5 s"):
        require_gone(left, "the workers of job j")


#: One rank of a two-rank gloo job (``python -c RANK_SCRIPT <port>``) whose SIGTERM handler
#: raises, like the trainer's: rank 1 freezes itself (SIGSTOP) after the first barrier,
#: rank 0 then blocks in an all_reduce that rank 1 never joins. Its handler cannot run while
#: it waits there (Python runs signal handlers between bytecodes), so it outlives SIGTERM.
RANK_SCRIPT = """
import os, signal, sys
import torch
import torch.distributed as dist

class Terminated(Exception):
    pass

def on_term(*_):
    raise Terminated()

signal.signal(signal.SIGTERM, on_term)
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=rank,
                        world_size=2)
dist.barrier()
print("ready", flush=True)
if rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
dist.all_reduce(torch.ones(4))
print("collective returned", flush=True)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_restart_sigkills_a_rank_blocked_in_a_gloo_collective_and_answers_once_it_is_gone(
    tmp_path: Path, spawn: Callable[..., subprocess.Popen[str]], kit: Any
) -> None:
    metrics = tmp_path / "node0" / "metrics"
    metrics.mkdir(parents=True)
    port = _free_port()
    ranks = []
    for rank in (0, 1):
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "blocked",
            "STORMWATCH_JOB": "blocked",
            "STORMWATCH_METRICS_DIR": str(metrics),
            "GLOO_SOCKET_IFNAME": "lo",
        }
        ranks.append(spawn(RANK_SCRIPT.replace("sys.argv[1]", str(port)), env=env))
    for proc in ranks:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    kit.wait_for(lambda: psutil.Process(ranks[1].pid).status() == psutil.STATUS_STOPPED, 10, "")
    time.sleep(0.5)  # rank 0 is inside the all_reduce by now
    procs = [psutil.Process(p.pid) for p in ranks]
    backend = LabBackend(
        diagnostics_dir=tmp_path, node_metrics_dirs={"node0": metrics}, grace_period_s=2
    )
    started = time.monotonic()
    detail = backend.restart_workers("blocked")
    took = time.monotonic() - started
    # Both outlived SIGTERM (rank 0 inside the collective, rank 1 stopped): SIGKILLed at
    # the grace period, and gone when the action answered.
    assert not any(running(proc) for proc in procs)
    assert 2.0 <= took < 5.0, took
    pids = [p.pid for p in ranks]
    assert detail.startswith(f"sent SIGTERM to 2 workers of job blocked (pids {pids}); ")
    assert f"SIGKILL to 2 still running 2 s after SIGTERM (pids {pids}); all gone" in detail
    assert backend.workers("blocked") == []
