"""What a training rank's environment says about it: the contract between whoever
launches ranks (torchrun, the lab's jobs, a Slurm or Kubernetes launcher) and whoever finds
them by their environment (the agent's rank watcher, the lab platform backend).

A rank has torchrun's ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and ``TORCHELASTIC_RUN_ID``
(plus ``TORCHELASTIC_RESTART_COUNT``); stormwatch adds ``STORMWATCH_JOB`` (the job's name,
default the run id) and ``STORMWATCH_METRICS_DIR`` (docs/ARCHITECTURE.md, "Agent").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

RankKey = tuple[str, int]
"""(job, rank)."""

#: The variables every rank has; a process without all of them is not a rank.
RANK_ENV_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")


@dataclasses.dataclass(frozen=True)
class RankEnv:
    """What a rank's environment says about it."""

    job: str
    rank: int
    local_rank: int
    world_size: int
    run_id: str
    restart_count: int | None
    metrics_dir: str | None = None

    @property
    def key(self) -> RankKey:
        return (self.job, self.rank)


def rank_env(environ: Mapping[str, str]) -> RankEnv | None:
    """Parse a rank's identity from its environment; None when it is not a rank.

    ``metrics_dir`` is ``STORMWATCH_METRICS_DIR`` only;
    :func:`stormwatch.agent.watch.procs.rank_metrics_dir` also reads the command line.
    """
    if any(name not in environ for name in RANK_ENV_VARIABLES):
        return None
    try:
        restart = environ.get("TORCHELASTIC_RESTART_COUNT")
        return RankEnv(
            job=environ.get("STORMWATCH_JOB") or environ["TORCHELASTIC_RUN_ID"],
            rank=int(environ["RANK"]),
            local_rank=int(environ["LOCAL_RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            run_id=environ["TORCHELASTIC_RUN_ID"],
            restart_count=int(restart) if restart is not None else None,
            metrics_dir=environ.get("STORMWATCH_METRICS_DIR") or None,
        )
    except ValueError:
        return None


__all__ = ["RANK_ENV_VARIABLES", "RankEnv", "RankKey", "rank_env"]
