"""The fault-free baseline a game day (the demo, a suite) compares an experiment's loss to.

A baseline is the experiment's job (steps, checkpoints, seed) trained without faults on
the lab, under a name of its own, to completion.
"""

from __future__ import annotations

import time

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.execution.reporter import Reporter
from stormwatch.chaos.experiment.model import JobSection
from stormwatch.lab import JobSpec, Lab
from stormwatch.lab.state import JobInfo
from stormwatch.trainer.telemetry.ranklogs import read_job_logs

#: Seconds a baseline may take per step (after start-up): generous for a loaded two-core
#: machine, where the demo's steps take about 0.4 s.
BASELINE_SECONDS_PER_STEP = 5.0
#: Seconds between two looks at the baseline's progress.
POLL_SECONDS = 0.5


def train_baseline(
    lab: Lab, name: str, job: JobSection, reporter: Reporter, *, step_delay: float
) -> JobInfo:
    """Train ``job`` as ``name`` without faults, reporting its steps, until every node's
    torchrun has exited (start-up time plus :data:`BASELINE_SECONDS_PER_STEP` a step).

    Raises:
        ChaosError: it failed, or did not finish in time; the job is stopped whenever
            this does not return.
    """
    info = lab.start_job(
        JobSpec(
            name=name,
            steps=job.steps,
            checkpoint_every=job.checkpoint_every,
            seed=job.seed,
            step_delay=step_delay,
        )
    )
    deadline = time.monotonic() + job.startup_timeout_seconds
    deadline += BASELINE_SECONDS_PER_STEP * job.steps
    try:
        while True:
            result = lab.job_result(name)
            if result.exit_codes and all(c is not None for c in result.exit_codes.values()):
                break
            if time.monotonic() > deadline:
                raise ChaosError(f"the baseline did not finish in time; see {info.job_dir}")
            log = read_job_logs(info.log_dir).get(0)
            last = log.last_step if log is not None else None
            if last is None:
                reporter.status("baseline: starting (torch import, rendezvous)")
            else:
                reporter.status(f"baseline: step {last.step}/{job.steps}, loss {last.loss:.4f}")
            time.sleep(POLL_SECONDS)
    except BaseException:
        lab.stop_job(name)
        raise
    if not result.ok:
        raise ChaosError(
            f"the baseline job failed (exit codes {result.exit_codes}); "
            f"see {info.job_dir}/<node>.torchrun.log"
        )
    return info


__all__ = ["BASELINE_SECONDS_PER_STEP", "train_baseline"]
