"""End to end (FC-14): a rank slowed through the chaos path is named by the straggler alert;
the ranks waiting for it are not.

A lab of its own (prefix, subnet and ports no other lab uses); ``stormwatch chaos run``
trains a 4-rank job (2 nodes x 2 ranks, no spare node: this test never uses one; two ranks
per node keep rank 1's tensor-parallel peer, rank 0, among the waiting ranks, and three
waiting ranks around the median the rule compares with) and arms the trainer fault point
``slow_step`` (1 s of extra compute per step) on rank 1 through node 0's agent. The test
then asks the lab's Prometheus, which loads alerts/rules/*.yml with its recording rules, for
the ``expr`` of ``StormwatchStraggler`` read from alerts/rules/training.yml (the alert has
no ``for``: its per-step windows are the hold, so the expression is the alert). It must name
rank 1, and only rank 1, within 20 s of the fault (issue 18's target; the rule's 10 s window
of slow steps plus the first slow step, the scrape and the evaluation). The
waiting ranks must also show the FC-14 signature: more collective wait per second than
rank 1 since the fault. Ctrl-C (SIGINT) then ends the experiment, which reverts the
fault (the ledger says so) and stops the job; the lab is torn down whatever happens.
"""

from __future__ import annotations

import ipaddress
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from stormwatch.alerts.rulefiles import rules_dir
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.contracts.fault_ledger import LedgerEntry
from stormwatch.lab import Lab, LabConfig
from stormwatch.lab.netns import IpRoute2

pytestmark = [pytest.mark.e2e, pytest.mark.root]
STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))
T = TypeVar("T")

EXPERIMENT = """\
version: 1
title: "Slow rank: rank 1 computes 1 s longer every step"
job:
  name: straggler
  world_size: 4
  steps: 1000
  checkpoint_every: 1000
  step_delay: 0.5
  seed: 0
  startup_timeout_seconds: 120
steady_state_hypothesis:
  title: Prometheus scrapes the compute time of all 4 ranks
  probes:
    - name: all-ranks-scraped
      provider:
        type: prometheus
        query: count(stormwatch_train_compute_seconds_total{training_job="${job}"})
        tolerance: 4
      timeout_seconds: 60
      phases: [before]
method:
  - type: action
    name: slow-rank-1
    when: {step: 3, timeout_seconds: 120}
    fault: {kind: trainer_fault, rank: 1, point: slow_step, seconds: 1.0, ttl_seconds: 180}
  - {type: pause, name: hold-while-the-test-queries, seconds: 180}
expect: {detect: false, loss: skip}
"""


def _straggler_expr() -> str:
    """The ``expr`` of StormwatchStraggler in alerts/rules/training.yml (without ``for``)."""
    groups = yaml.safe_load((rules_dir() / "training.yml").read_text())["groups"]
    [rule] = [r for g in groups for r in g["rules"] if r.get("alert") == "StormwatchStraggler"]
    return str(rule["expr"])


def _isolated_lab() -> LabConfig:
    """A lab configuration (prefix, 10.215.x.0/24 subnet, loopback ports) nothing else uses."""
    ports: set[int] = set()
    while len(ports) < 3:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.add(int(sock.getsockname()[1]))
    used = [iface.network for _, iface in IpRoute2().addresses()]
    subnet = next(
        net
        for net in (
            ipaddress.IPv4Network(f"10.215.{i}.0/24") for i in random.sample(range(256), 256)
        )
        if not any(net.overlaps(u) for u in used)
    )
    prometheus, alertmanager, responder = sorted(ports)
    return LabConfig(
        nodes=2,  # the job's two, no spare (one agent and slurmd fewer)
        prefix=f"sws{random.randrange(16**4):04x}",
        subnet=subnet,
        prometheus_port=prometheus,
        alertmanager_port=alertmanager,
        responder_port=responder,
    )


def _poll(get: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while (found := get()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.5)
    return found


def _injected(run_dir: Path) -> LedgerEntry | None:
    path = ledger_path(run_dir)
    entries = Ledger(path).entries() if path.exists() else []
    return next((e for e in entries if e.state == "injected"), None)


@pytest.mark.timeout(300)
def test_a_slowed_rank_is_named_by_the_straggler_alert_and_the_waiting_ranks_are_not(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab creates network namespaces")
    straggler = _straggler_expr()
    experiment = tmp_path / "slow-rank.yaml"
    experiment.write_text(EXPERIMENT)
    run_dir, log = tmp_path / "run", tmp_path / "chaos-run.log"
    config = _isolated_lab()
    lab = Lab(run_dir)
    named: list[set[str]] = []
    named_at: list[float] = []
    try:
        lab.up(config)
        run = [STORMWATCH, "chaos", "run", str(experiment), "--run-dir", str(run_dir)]
        with log.open("w") as out:
            controller = subprocess.Popen(
                [*run, "--no-postmortem"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "COLUMNS": "100"},
            )
        try:
            fault = _poll(lambda: _injected(run_dir), 180, "the slow_step fault on rank 1")
            prometheus = lab.prometheus()

            def rank_1_named_thrice() -> bool | None:
                ranks = {s.labels["rank"] for s in prometheus.query(straggler)}
                if ranks:
                    named.append(ranks)
                    named_at.append(time.time())
                return True if sum("1" in r for r in named) >= 3 else None

            _poll(rank_1_named_thrice, 60, "StormwatchStraggler's expression to name rank 1")
            named_after = named_at[0] - (fault.injected_at or 0)
            since = max(5, int(time.time() - (fault.injected_at or 0)))
            waits = {
                s.labels["rank"]: s.value
                for s in prometheus.query(
                    "sum by (rank) "
                    f"(rate(stormwatch_train_collective_wait_seconds_total[{since}s]))"
                )
            }
        finally:
            controller.send_signal(signal.SIGINT)  # the experiment reverts its fault
            try:
                code = controller.wait(timeout=90)
            except subprocess.TimeoutExpired:
                controller.kill()
                code = controller.wait()
    finally:
        lab.down(config)
        print(log.read_text() if log.exists() else "")  # shown when the test fails

    assert named and all(ranks == {"1"} for ranks in named), named
    print(f"FIGURES straggler: rank 1 named {named_after:.1f} s after the slow_step fault")
    assert named_after <= 20, f"rank 1 named {named_after:.1f} s after the fault (target 20 s)"
    assert set(waits) == {"0", "1", "2", "3"}, waits
    assert min(waits[r] for r in ("0", "2", "3")) > waits["1"], waits
    assert code == 130, "chaos run ends as interrupted"
    [entry] = Ledger(ledger_path(run_dir), create=False).entries()
    assert (entry.kind, entry.spec.target_rank(), entry.state) == ("trainer_fault", 1, "reverted")
