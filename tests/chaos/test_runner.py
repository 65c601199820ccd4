"""The runner's verdicts and rollback strategies, on real stand-in ranks (no lab)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

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


def test_a_trigger_already_past_when_the_job_is_first_observed_is_not_injected(
    tmp_path: Path, start_workload: Any, unique_job: Any, wait_until: Any
) -> None:
    # A re-run that attaches to (or resumes) a job already beyond when.step must not
    # fire late, on a job that may be finished: the action fails, nothing is injected.
    job = unique_job("late")
    workload = start_workload(job, step_seconds=0.02)
    wait_until(lambda: workload.steps() >= 15, 30, "the rank to pass step 15")
    text = _experiment(job, strategy="always", after_window=5.0).replace(
        "    name: freeze\n", "    name: freeze\n    when: {step: 10}\n"
    )

    result = _run(tmp_path, job, text)

    journal = result.journal
    assert result.exit_code == 1 and journal.status == "failed"
    [action, hold] = journal.method
    assert (action.name, action.status) == ("freeze", "failed")
    assert action.error and "already past" in action.error and "when.step=10" in action.error
    assert hold.status == "skipped"
    assert journal.error and "already past" in journal.error
    assert Ledger(ledger_path(tmp_path / "run"), create=False).entries() == []
    assert not workload.stopped


def test_job_name_for_gives_every_run_its_own_job() -> None:
    from stormwatch.chaos.execution.runner import job_name_for, new_experiment_id
    from stormwatch.lab import JobSpec

    first, second = new_experiment_id("kill rank"), new_experiment_id("kill rank")
    names = {job_name_for("experiment", first), job_name_for("experiment", second)}
    assert len(names) == 2
    for name in names:
        assert name.startswith("experiment-") and len(name) <= 63
        JobSpec(name=name, steps=1)  # a valid lab job name
    assert job_name_for("x" * 40, "custom id/with spaces").startswith("x" * 40 + "-")
    assert job_name_for("e", "20250101T120000-kill-rank-1a2b") == "e-20250101t120000-1a2b"


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("Kill rank 1 of a Lightning job", 20, "kill-rank-1-of-a"),  # not "...-a-lig"
        ("Kill rank 1 of a", 16, "kill-rank-1-of-a"),  # exactly the limit: whole
        ("kill-rank-1-of-a-b", 16, "kill-rank-1-of-a"),  # the next word begins at the limit
        ("Supercalifragilistic expialidocious", 10, "supercalif"),  # one long first word
        ("  ---  ", 10, "experiment"),
        ("Slow rank: rank 1 gets 10 % of a CPU", 40, "slow-rank-rank-1-gets-10-of-a-cpu"),
        ("Über große Störung", 20, "uber-grosse-storung"),  # not "ber-gro-e-st-rung"
        ("ﬁx rank", 10, "fix-rank"),
    ],
)
def test_ids_are_cut_at_a_words_end(text: str, limit: int, expected: str) -> None:
    from stormwatch.chaos.execution.ids import new_experiment_id, slug

    assert slug(text, limit, "experiment") == expected
    made = new_experiment_id("Kill rank 1 of a Lightning job on a two-node Slurm cluster")
    assert made[16:-5] == "kill-rank-1-of-a-lightning-job-on-a-two"  # 40 cut "node" to "n"
