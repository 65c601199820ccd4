"""End to end: a SHORT game day (2 experiments) on a real lab through ``stormwatch chaos suite``,
producing the scorecard; then ``stormwatch plan`` reads it. Own names, subnet and ports.

The lab is the smallest that runs a suite's jobs the shipped way (sbatch, torchrun on two
nodes): two nodes of one rank each, no spare. The suite's subjects (scoring, the baseline,
SIGINT's aborts and reverts, the scorecard ``plan`` reads) do not depend on the ranks per
node or a spare node, and every one of the suite's five worker-group starts costs half the
torch start-up CPU of four ranks (the demo's own 2 x 2 lab; several ranks on one node are
covered by tests/chaos/test_catalogue_on_lab.py)."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stormwatch.chaos.gameday.scorecard import latest_scorecard, load_scorecard
from stormwatch.chaos.reports.verify import Verification
from stormwatch.contracts.journal import load_journal
from stormwatch.lab import Lab, LabConfig

pytestmark = pytest.mark.e2e
STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))

SUITE_LAB = LabConfig(
    prefix="swsuite",
    subnet=ipaddress.IPv4Network("10.221.0.0/24"),
    prometheus_port=29290,
    alertmanager_port=29293,
    responder_port=29295,
    rdzv_port=29510,
    nodes=2,
    nproc_per_node=1,
)

#: The job of each experiment. 20 steps for the two scored ones (and so for the baseline):
#: the kill after step 15 resumes from the step-10 checkpoint with 10 steps to go, and the
#: after-phase reads only rank logs (job-finishes), which stay once the job has ended.
_JOB = """
job:
  name: {name}
  world_size: 2
  steps: {steps}
  checkpoint_every: 10
  step_delay: 0.3
  seed: 0
  startup_timeout_seconds: 300
steady_state_hypothesis:
  title: Both ranks make progress and the job finishes
  probes:
    - name: all-ranks-progressing
      provider:
        type: prometheus
        query: >-
          count(time() - max by (rank)
          (stormwatch_train_last_step_timestamp_seconds{{training_job="${{job}}"}}) < 15)
        tolerance: 2
      timeout_seconds: 30
      phases: [before]
    - name: job-finishes
      provider: {{type: job, expect: finished}}
      timeout_seconds: 600
      phases: [after]
rollbacks:
  - {{type: revert, name: revert-experiment-faults}}
"""

KILL = (
    """version: 1
title: "Rank kill: rank 1 after step 15"
"""
    + _JOB.format(name="e2e-kill", steps=20)
    + """method:
  - type: action
    name: kill-rank-1
    when: {step: 15, timeout_seconds: 600}
    fault: {kind: kill_rank, rank: 1, signal: SIGKILL, ttl_seconds: 120}
  - type: until
    name: stall-alert-fires
    query: count(ALERTS{alertname="StormwatchRankStalled", alertstate="firing"})
    tolerance: {ge: 1}
    timeout_seconds: 180
    poll_seconds: 1
expect: {alerts: [StormwatchRankStalled], category: software_bug}
"""
)

LONG_FREEZE = (
    """version: 1
title: "Long freeze: rank 1 stopped, interrupted"
"""
    + _JOB.format(name="e2e-sigint", steps=30)
    + """method:
  - type: action
    name: freeze-rank-1
    when: {step: 2, timeout_seconds: 600}
    fault: {kind: freeze_rank, rank: 1, ttl_seconds: 600}
  - {type: pause, name: hold, seconds: 300}
expect: {detect: false, loss: skip}
"""
)

FREEZE = (
    """version: 1
title: "Short freeze: rank 1 stopped for 4 s"
"""
    + _JOB.format(name="e2e-freeze", steps=20)
    + """method:
  - type: action
    name: freeze-rank-1
    when: {step: 10, timeout_seconds: 600}
    fault: {kind: freeze_rank, rank: 1, ttl_seconds: 4}
  - {type: pause, name: hold, seconds: 6}
expect: {detect: false}
"""
)


@pytest.mark.timeout(1800)
def test_a_short_suite_on_the_lab_writes_a_scorecard_that_plan_reads(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab creates network namespaces")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "01-kill.yaml").write_text(KILL)
    (suite / "02-freeze.yaml").write_text(FREEZE)
    run_dir = tmp_path / "run"
    lab = Lab(run_dir)
    try:
        lab.up(SUITE_LAB)
        out = subprocess.run(
            [STORMWATCH, "chaos", "suite", str(suite), "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=1500,
            env={**os.environ, "COLUMNS": "100"},
        )
        path = latest_scorecard(run_dir)
        interrupted = _interrupted_suite(tmp_path, run_dir)
    finally:
        lab.down(SUITE_LAB)
    print(out.stdout, out.stderr)  # shown when the test fails

    assert path is not None, out.stderr
    card = load_scorecard(path)
    print((path.parent / "scorecard.md").read_text())
    assert "**2/2 passed**" in (path.parent / "scorecard.md").read_text()
    assert "[1/2] 01-kill.yaml" in out.stderr and "[2/2] 02-freeze.yaml" in out.stderr
    kill, freeze = card.rows
    assert kill.fault.startswith("kill_rank rank 1 (") and kill.category == "software_bug"
    assert kill.detected and kill.alert == "StormwatchRankStalled", kill
    assert kill.time_to_detect_seconds is not None and kill.time_to_detect_seconds > 0
    assert kill.time_to_recover_seconds is not None and kill.steps_lost is not None
    assert (kill.loss, kill.checkpoint, kill.faults_cleared) == (True, True, True), kill
    assert kill.verdict == "pass", kill.reasons
    assert freeze.fault_kind == "freeze_rank" and freeze.status == "completed", freeze
    assert (freeze.loss, freeze.faults_cleared) == (True, True), freeze
    assert freeze.verdict == "pass", freeze.reasons
    assert out.returncode == 0, out.stderr
    assert card.baselines == {"0": card.baselines["0"]}
    verification = Verification.model_validate_json(
        (Path(kill.experiment_dir or "") / "verification.json").read_text()
    )
    assert "loads" in verification.checkpoint.detail

    # SIGINT during an experiment: its rollbacks and final revert run, the rest is not run.
    assert interrupted.returncode == 130, interrupted.stderr
    assert "SIGINT received: aborting" in interrupted.stderr
    sigint_card = load_scorecard(latest_scorecard(run_dir) or Path())
    assert sigint_card.interrupted and sigint_card.suite_id != card.suite_id
    frozen, skipped = sigint_card.rows
    assert frozen.status == "aborted" and frozen.verdict == "fail", frozen
    assert frozen.faults_cleared is True, frozen
    assert skipped.verdict == "not run" and skipped.experiment_id is None
    sigint_journal = load_journal(Path(frozen.experiment_dir or "") / "journal.json")
    assert [r.status for r in sigint_journal.rollbacks] == ["succeeded"]
    assert [f.state for f in sigint_journal.faults] == ["reverted"]

    plan = subprocess.run(
        [STORMWATCH, "plan", "--gpus", "16384", "--replicas", "20", "--scorecard", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plan.returncode == 0, plan.stderr
    assert f"from {path} for software_bug" in " ".join(plan.stdout.split())


def _interrupted_suite(tmp_path: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    """A suite SIGINTed while its first experiment holds a rank frozen (FC-13)."""
    suite = tmp_path / "suite-sigint"
    suite.mkdir()
    (suite / "01-long-freeze.yaml").write_text(LONG_FREEZE)
    (suite / "02-kill.yaml").write_text(KILL)
    proc = subprocess.Popen(
        [STORMWATCH, "chaos", "suite", str(suite), "--run-dir", str(run_dir), "--no-baseline"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "freeze-rank-1: SIGSTOP" in line:
            break
    else:
        proc.wait(timeout=60)
        raise AssertionError("the freeze never happened:\n" + "".join(seen))
    proc.send_signal(signal.SIGINT)
    rest_out, rest_err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, rest_out, "".join(seen) + rest_err
    )
