"""The runner's verdicts and rollback strategies, on real stand-in ranks (no lab)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from stormwatch.chaos import (
    AttachedJobs,
    Ledger,
    Runner,
    RunnerConfig,
    Target,
    ledger_path,
    parse_experiment,
)


def _run(tmp_path: Path, job: str, text: str) -> Any:
    run_dir = tmp_path / "run"
    target = Target(run_dir=run_dir, jobs=AttachedJobs(run_dir, world_size=1), world_size=1)
    runner = Runner(
        parse_experiment(text),
        source=Path("inline.yaml"),
        target=target,
        config=RunnerConfig(attach_job=job),
    )
    return asyncio.run(runner.run())


def _experiment(job: str, *, strategy: str, after_window: float) -> str:
    return f"""
version: 1
title: freeze and check
job: {{name: {job}, steps: 1000000, checkpoint_every: 10}}
steady_state_hypothesis:
  title: the rank steps
  probes:
    - name: rank-progressing
      provider: {{type: job, expect: progressing, window_seconds: {after_window}}}
      timeout_seconds: 5
method:
  - type: action
    name: freeze
    fault: {{kind: freeze_rank, rank: 0, ttl_seconds: 3600}}
  - {{type: pause, name: hold, seconds: 0.5}}
rollbacks:
  - {{type: revert, name: undo}}
rollback_strategy: {strategy}
"""


def test_deviation_with_strategy_never_skips_rollbacks_but_still_reverts_the_fault(
    tmp_path: Path,
    start_workload: Any,
    unique_job: Any,
    find_reapers: Any,
    wait_until: Any,
) -> None:
    job = unique_job("never")
    workload = start_workload(job)

    # The fault is never undone by a rollback, so the rank stays frozen through "after".
    result = _run(tmp_path, job, _experiment(job, strategy="never", after_window=1.0))

    journal = result.journal
    assert result.exit_code == 1
    assert journal.status == "deviated"
    assert journal.steady_state_before.met is True and journal.steady_state_after.met is False
    assert [(r.name, r.status) for r in journal.rollbacks] == [("undo", "skipped")]
    assert [(r.name, r.status) for r in journal.cleanup] == [("revert-open-faults", "succeeded")]
    [entry] = Ledger(ledger_path(tmp_path / "run"), create=False).entries()
    assert entry.state == "reverted" and entry.revert_reason == "end of experiment"
    assert not workload.stopped
    wait_until(lambda: not find_reapers(ledger_path(tmp_path / "run")), 10, "the reaper to exit")


def test_hypothesis_not_met_before_skips_the_method_and_injects_nothing(
    tmp_path: Path,
    start_workload: Any,
    unique_job: Any,
    wait_until: Any,
) -> None:
    job = unique_job("before")
    workload = start_workload(job)
    os.kill(workload.process.pid, signal.SIGSTOP)  # a rank that hangs before the experiment
    wait_until(lambda: workload.stopped, 5, "the rank to stop")
    time.sleep(1.0)  # older than the probe's 0.5 s window

    result = _run(tmp_path, job, _experiment(job, strategy="always", after_window=0.5))

    journal = result.journal
    assert result.exit_code == 1 and journal.status == "failed"
    assert journal.steady_state_before.met is False and journal.steady_state_after.met is None
    assert [(r.name, r.status) for r in journal.method] == []
    assert [(r.name, r.status) for r in journal.rollbacks] == [("undo", "succeeded")]
    assert Ledger(ledger_path(tmp_path / "run"), create=False).entries() == []
    assert journal.error and "did not hold before" in journal.error
