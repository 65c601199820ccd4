"""The fault-free baseline a game day (the demo, a suite) compares an experiment's loss to.

A baseline is the experiment's job (steps, checkpoints, seed) trained without faults on
the target (the lab, or a Slurm or Kubernetes target that submits jobs), under a name of
its own, to completion.
"""

from __future__ import annotations

import time
from pathlib import Path

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.execution.reporter import Reporter
from stormwatch.chaos.experiment.model import JobSection
from stormwatch.chaos.target import JobControl
from stormwatch.contracts.journal import JobRef
from stormwatch.telemetry.ranklogs import read_job_logs

#: Seconds a baseline may take per step (after start-up): generous for a loaded two-core
#: machine, where the demo's steps take about 0.4 s.
BASELINE_SECONDS_PER_STEP = 5.0
#: Seconds between two looks at the baseline's progress.
POLL_SECONDS = 0.5


def train_baseline(
    jobs: JobControl, name: str, job: JobSection, reporter: Reporter, *, step_delay: float
) -> JobRef:
    """Train ``job`` as ``name`` without faults on the target's ``jobs`` (the lab's, a
    Slurm or Kubernetes target's), reporting its steps, until it has ended (start-up time
    plus :data:`BASELINE_SECONDS_PER_STEP` a step).

    Raises:
        ChaosError: it could not start, failed, or did not finish in time; the job is
            stopped whenever this does not return.
    """
    # A fixed-size job at the default batch, as the first baselines were (a lab JobSpec of
    # name, steps, checkpoint interval, seed and step delay).
    fault_free = job.model_copy(
        update={"name": name, "step_delay": step_delay, "min_nodes": None, "global_batch": None}
    )
    ref = jobs.start(fault_free)
    deadline = time.monotonic() + job.startup_timeout_seconds
    deadline += BASELINE_SECONDS_PER_STEP * job.steps
    try:
        while (ok := jobs.exited(name)) is None or not jobs.ended(name):
            if time.monotonic() > deadline:
                raise ChaosError(f"the baseline did not finish in time; see {ref.log_dir}")
            log = read_job_logs(Path(ref.log_dir)).get(0)
            last = log.last_step if log is not None else None
            if last is None:
                reporter.status("baseline: starting (torch import, rendezvous)")
            else:
                reporter.status(f"baseline: step {last.step}/{job.steps}, loss {last.loss:.4f}")
            time.sleep(POLL_SECONDS)
    except BaseException:
        jobs.stop(name)
        raise
    if not ok:
        raise ChaosError(f"the baseline job {name} failed; see its logs in {ref.log_dir}")
    return ref


__all__ = ["BASELINE_SECONDS_PER_STEP", "train_baseline"]
