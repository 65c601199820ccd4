"""A chaos controller process for fast tests (run as a script, not imported by pytest).

    python controller.py EXPERIMENT RUN_DIR JOB WORLD_SIZE

Runs EXPERIMENT with the library's runner and signal handling
(:func:`stormwatch.chaos.run_experiment`) against a job started by other means
(:class:`stormwatch.chaos.AttachedJobs`: rank logs in RUN_DIR/jobs/JOB/logs),
so SIGINT/SIGKILL behaviour can be tested without a lab. Prints the journal
path, exits with the runner's exit status.
"""

from __future__ import annotations

import sys
from pathlib import Path

from stormwatch.chaos import AttachedJobs, Runner, RunnerConfig, Target, load_experiment
from stormwatch.chaos.execution.runner import run_experiment


class _PrintReporter:
    def status(self, text: str) -> None:
        pass

    def event(self, text: str) -> None:
        print(text, flush=True)


def main() -> int:
    experiment_file, run_dir, job, world_size = sys.argv[1:5]
    run_dir_path = Path(run_dir)
    target = Target(
        run_dir=run_dir_path,
        jobs=AttachedJobs(run_dir_path, world_size=int(world_size)),
        world_size=int(world_size),
    )
    runner = Runner(
        load_experiment(experiment_file),
        source=Path(experiment_file),
        target=target,
        config=RunnerConfig(attach_job=job),
        reporter=_PrintReporter(),
    )
    print(f"experiment-dir {runner.experiment_dir}", flush=True)
    result = run_experiment(runner)
    print(f"status {result.journal.status}", flush=True)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
