"""End to end (FC-14): a rank slowed through the chaos path is named by the straggler alert;
the ranks waiting for it are not.

On the shared Slurm lab (``slurm_lab``, tests/slurm_lab.py: three nodes, jobs on two, 2
ranks each; up once for all its users instead of a lab of this test's own, which cost a
lab up and down), ``stormwatch chaos run`` trains a 4-rank job (2 nodes x 2 ranks) and
arms the trainer fault point ``slow_step`` (1 s of extra compute per step) on rank 1
through node 0's agent. The test then asks the lab's Prometheus, which loads
alerts/rules/*.yml with its recording rules, for the ``expr`` of ``StormwatchStraggler``
read from alerts/rules/training.yml, and keeps the samples of this experiment's job (the
shared lab's Prometheus also holds other tests' jobs). Its ``for: 2m`` is left out so the
test does not wait two minutes: the expression is what names the rank, ``for`` only
delays the firing. The recording rule it reads keeps its ``rate(...[2m])``: ``rate`` uses
the samples it has, so a window reaching back before the job started averages over the
job's life, and the slowed rank's compute share passes 0.1 and 1.3x the median about 20 s
after the fault (measured), so no shorter range is needed. The waiting ranks must also
show the FC-14 signature: more collective wait per second than rank 1 since the fault.
Ctrl-C (SIGINT) then ends the experiment, which reverts the fault (the ledger says so) and
stops the job, so the shared lab is left with no Slurm job (its fixture checks).
"""

from __future__ import annotations

import os
import signal
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
from stormwatch.lab import Lab

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
        query: count(stormwatch_train_compute_seconds_total{job="${job}"})
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


def _poll(get: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while (found := get()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.5)
    return found


def _injected(run_dir: Path, since: float) -> LedgerEntry | None:
    """The ``trainer_fault`` injected by this test's experiment (the shared lab's ledger
    also holds the faults of the tests before it)."""
    path = ledger_path(run_dir)
    entries = Ledger(path).entries() if path.exists() else []
    ours = (e for e in entries if e.kind == "trainer_fault" and e.recorded_at >= since)
    return next((e for e in ours if e.state == "injected"), None)


@pytest.mark.timeout(300)
def test_a_slowed_rank_is_named_by_the_straggler_alert_and_the_waiting_ranks_are_not(
    slurm_lab: Lab, tmp_path: Path
) -> None:
    lab, started = slurm_lab, time.time()
    straggler = _straggler_expr()
    experiment = tmp_path / "slow-rank.yaml"
    experiment.write_text(EXPERIMENT)
    run_dir, log = lab.run_dir, tmp_path / "chaos-run.log"
    named: list[set[str]] = []
    try:
        run = [STORMWATCH, "chaos", "run", str(experiment), "--run-dir", str(run_dir)]
        with log.open("w") as out:
            controller = subprocess.Popen(
                [*run, "--no-postmortem"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "COLUMNS": "100"},
            )
        try:
            fault = _poll(lambda: _injected(run_dir, started), 180, "the slow_step fault on rank 1")
            job = fault.target.job  # this experiment's job: the samples of other jobs are not ours
            prometheus = lab.prometheus()

            def rank_1_named_thrice() -> bool | None:
                samples = prometheus.query(straggler)
                ranks = {s.labels["rank"] for s in samples if s.labels.get("job") == job}
                if ranks:
                    named.append(ranks)
                return True if sum("1" in r for r in named) >= 3 else None

            _poll(rank_1_named_thrice, 60, "StormwatchStraggler's expression to name rank 1")
            since = max(5, int(time.time() - (fault.injected_at or 0)))
            waits = {
                s.labels["rank"]: s.value
                for s in prometheus.query(
                    "sum by (rank) (rate(stormwatch_train_collective_wait_seconds_total"
                    f'{{job="{job}"}}[{since}s]))'
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
        print(log.read_text() if log.exists() else "")  # shown when the test fails

    assert named and all(ranks == {"1"} for ranks in named), named
    assert set(waits) == {"0", "1", "2", "3"}, waits
    assert min(waits[r] for r in ("0", "2", "3")) > waits["1"], waits
    assert code == 130, "chaos run ends as interrupted"
    ours = Ledger(ledger_path(run_dir), create=False).entries()
    [entry] = [e for e in ours if e.experiment_id == fault.experiment_id]
    assert (entry.kind, entry.spec.target_rank(), entry.state) == ("trainer_fault", 1, "reverted")
