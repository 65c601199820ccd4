"""What a training rank's environment says about it: the contract between whoever
launches ranks (torchrun, the lab's jobs, a Slurm or Kubernetes launcher) and whoever finds
them by their environment (the agent's rank watcher, the lab platform backend).

A rank has torchrun's ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and ``TORCHELASTIC_RUN_ID``
(plus ``TORCHELASTIC_RESTART_COUNT``); stormwatch adds ``STORMWATCH_JOB`` (the job's name,
default the run id), ``STORMWATCH_METRICS_DIR`` (docs/ARCHITECTURE.md, "Agent") and,
from launchers that know it, ``STORMWATCH_JOB_INSTANCE`` (one submission of the job:
:attr:`RankEnv.instance`).

A Slurm task that is a rank itself (``srun ... stormwatch run -- python train.py``: no
torchrun in between) has srun's ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``
(plus ``SLURM_RESTART_COUNT``) and ``STORMWATCH_RUN_ID``, which ``stormwatch run`` sets
(``<SLURM_JOB_ID>.<SLURM_STEP_ID>``) in place of torchrun's run id
(:mod:`stormwatch.telemetry.zerocode.environ`).

Ranks descend from a launcher (:func:`is_rank_launcher`): a torchrun elastic agent
(:func:`is_torchrun_agent`) or, for such Slurm tasks, the step's ``slurmstepd``. A launcher
is never a rank itself, whatever its environment says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

RankKey = tuple[str, int]
"""(job, rank)."""

#: The variables every torchrun worker has; with all of them a process is a rank.
RANK_ENV_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")
#: Set by ``stormwatch run`` on a Slurm task that is a rank itself (its run id).
RUN_ID_ENV = "STORMWATCH_RUN_ID"
#: srun's rank, local rank and world size: with :data:`RUN_ID_ENV`, a process is a rank.
SRUN_RANK_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")

#: (run-id variable, rank / local rank / world size variables, restart-count variable) of
#: a torchrun worker, then of a Slurm task marked by ``stormwatch run``; the first that fits.
_IDENTITIES = (
    (RANK_ENV_VARIABLES[3], RANK_ENV_VARIABLES[:3], "TORCHELASTIC_RESTART_COUNT"),
    (RUN_ID_ENV, SRUN_RANK_VARIABLES, "SLURM_RESTART_COUNT"),
)
#: One submission of a job, the same across its restarts (:attr:`RankEnv.instance`).
JOB_INSTANCE_ENV = "STORMWATCH_JOB_INSTANCE"
_TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})


@dataclasses.dataclass(frozen=True)
class RankEnv:
    """What a rank's environment says about it.

    ``instance``: one submission (start) of the job, the same across torchrun restarts,
    elastic membership changes and Slurm requeues, another for a fresh start:
    ``STORMWATCH_JOB_INSTANCE`` when the launcher sets it (the lab does: a relaunch under a
    fresh rendezvous id is still the same start), else ``SLURM_JOB_ID`` (a requeue keeps
    it), else the run id (torchrun's ``--rdzv-id``).
    """

    job: str
    rank: int
    local_rank: int
    world_size: int
    run_id: str
    restart_count: int | None
    metrics_dir: str | None = None
    instance: str = ""

    @property
    def key(self) -> RankKey:
        return (self.job, self.rank)


def rank_env(environ: Mapping[str, str]) -> RankEnv | None:
    """Parse a rank's identity from its environment; None when it is not a rank.

    torchrun's variables first; else a Slurm task marked by ``stormwatch run``
    (:data:`RUN_ID_ENV` with :data:`SRUN_RANK_VARIABLES`). ``metrics_dir`` is
    ``STORMWATCH_METRICS_DIR`` only; :func:`stormwatch.agent.watch.procs.rank_metrics_dir`
    also reads the command line.
    """
    found = [i for i in _IDENTITIES if i[0] in environ and all(n in environ for n in i[1])]
    if not found:
        return None
    run_id_name, (rank, local_rank, world_size), restart_name = found[0]
    try:
        restart = environ.get(restart_name)
        return RankEnv(
            job=environ.get("STORMWATCH_JOB") or environ[run_id_name],
            rank=int(environ[rank]),
            local_rank=int(environ[local_rank]),
            world_size=int(environ[world_size]),
            run_id=environ[run_id_name],
            restart_count=int(restart) if restart is not None else None,
            metrics_dir=environ.get("STORMWATCH_METRICS_DIR") or None,
            instance=environ.get(JOB_INSTANCE_ENV)
            or environ.get("SLURM_JOB_ID")
            or environ[run_id_name],
        )
    except ValueError:
        return None


def is_torchrun_agent(name: str, cmdline: Sequence[str]) -> bool:
    """Whether a process is a torchrun (elastic agent) launcher.

    True for a process named ``torchrun``, a command line whose first or second
    word is a file named ``torchrun`` (``python /venv/bin/torchrun ...``), and
    ``python -m torch.distributed.run|launch``.
    """
    if name == "torchrun":
        return True
    if any(Path(arg).name == "torchrun" for arg in cmdline[:2]):
        return True
    for i, arg in enumerate(cmdline[:3]):
        if arg == "-m" and i + 1 < len(cmdline) and cmdline[i + 1] in _TORCHRUN_MODULES:
            return True
    return False


def is_rank_launcher(name: str, cmdline: Sequence[str]) -> bool:
    """Whether ranks may descend from this process: a torchrun agent
    (:func:`is_torchrun_agent`) or a Slurm step daemon (``slurmstepd``, whose tasks are
    ranks under ``srun ... stormwatch run``)."""
    return name == "slurmstepd" or is_torchrun_agent(name, cmdline)


__all__ = [
    "JOB_INSTANCE_ENV",
    "RANK_ENV_VARIABLES",
    "RUN_ID_ENV",
    "SRUN_RANK_VARIABLES",
    "RankEnv",
    "RankKey",
    "is_rank_launcher",
    "is_torchrun_agent",
    "rank_env",
]
