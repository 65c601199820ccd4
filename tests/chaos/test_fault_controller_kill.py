"""FC-13: a controller SIGKILLed at random points of 30 experiments leaves nothing applied.

The controller (``fault_controller_fork.py``) runs the real injection path
against a real agent in a namespace, for cheap faults with 1-2 s TTLs, and is
killed at a seeded random moment of each experiment. Afterwards: every fault
the agent applied was reverted by the agent within its TTL (plus the agent's
expiry period), nothing is left in A (iptables chains, qdisc, simulated GPU
state), and ``revert --all`` on the controller's ledger closes every row the
dead controllers left open.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.ledger.revert import revert_open

pytestmark = pytest.mark.root

SEED, EXPERIMENTS = 1305, 30
#: The agent checks TTLs every 0.25 s (agent/runtime.py EXPIRY_PERIOD); a revert takes
#: a few iptables calls on a loaded 2-core machine.
TTL_SLACK_S = 1.5


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fault_netns = _load("fault_netns")


@pytest.fixture
def net(tmp_path: Path) -> Iterator[object]:
    lab = fault_netns.FaultNet(tmp_path / "net").up()
    try:
        yield lab
    finally:
        lab.down()


LAUNCHER = """
import os, signal, subprocess, sys, time
# the test stops it with SIGTERM: exit through `finally`, or its rank outlives the test
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
job, metrics = sys.argv[-2], sys.argv[-1]
env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TORCHELASTIC_RUN_ID=job,
           STORMWATCH_JOB=job, STORMWATCH_METRICS_DIR=metrics)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
print(child.pid, flush=True)
try:
    time.sleep(600)
finally:
    child.kill()
"""


@pytest.fixture
def rank(net, tmp_path: Path) -> Iterator[int]:
    """A stand-in rank 0 of job ``job`` under a ``torchrun``, claimed by the agent in A."""
    script = tmp_path / "bin" / "torchrun"
    script.parent.mkdir()
    script.write_text(LAUNCHER)
    launcher = subprocess.Popen(
        [sys.executable, str(script), "job", str(net.metrics_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    deadline = time.monotonic() + 15
    while not [
        r for r in net.request("GET", f"{net.agent_url}/v1/ranks")[1]["ranks"] if r["alive"]
    ]:
        assert time.monotonic() < deadline, "the agent did not claim the stand-in rank"
        time.sleep(0.1)
    yield pid
    launcher.terminate()
    launcher.wait(10)
    launcher.stdout.close()


def test_controller_killed_30_times_leaves_every_fault_reverted_within_its_ttl(
    net, rank: int, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ckpt_base = tmp_path / "ckpt"
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("fault_controller_fork.py")),
            str(run_dir),
            net.agent_url,
            net.fault_url,
            str(net.token_file),
            net.addr_b,
            str(SEED),
            str(EXPERIMENTS),
            str(ckpt_base),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(runs) == EXPERIMENTS

    time.sleep(2.0 + TTL_SLACK_S)  # the longest TTL, then the agent's expiry check
    status, answer = net.request("GET", f"{net.fault_url}/v1/faults")
    assert status == 200
    records = answer["faults"]
    applied = [r for r in records if r["applied_at"] is not None]
    assert applied, "no kill landed after an injection: the seed no longer covers that point"
    for record in records:
        assert record["state"] in ("reverted", "failed"), record
    for record in applied:
        assert record["revert_reason"] == "ttl", record
        assert record["reverted_at"] <= record["expires_at"] + TTL_SLACK_S, record

    assert net.rules() == []
    assert "tbf" not in net.qdisc()
    assert psutil.Process(rank).status() != psutil.STATUS_STOPPED
    assert not any(Path("/sys/fs/cgroup").glob("**/stormwatch-faults/*/cgroup.procs"))
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(ckpt_base) not in mounts and "stormwatch-fault" not in mounts
    kinds = {run["kind"] for run in runs}
    assert {"freeze_ranks", "cpu_throttle", "checkpoint_readonly", "partition"} <= kinds
    assert all(v == 1 for _, v in net.samples("stormwatch_nvlink_link_up"))
    throttled = [
        labels
        for labels, value in net.samples("stormwatch_gpu_clocks_event_active")
        if value and "thermal" in labels["reason"]
    ]
    assert throttled == []

    ledger = Ledger(ledger_path(run_dir))
    left = ledger.open_faults()
    assert left, "the dead controllers left no open row: revert --all is not exercised"
    outcomes = asyncio.run(revert_open(ledger, reason="revert --all"))
    assert all(o.ok for o in outcomes), [o for o in outcomes if not o.ok]
    assert len(outcomes) == len(left)
    assert ledger.open_faults() == []
