"""Where a process is in its job and where its telemetry goes, read from the launcher.

:func:`placement` reads the rank, local rank, world size and attempt from torchrun
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``TORCHELASTIC_RESTART_COUNT``), else from
srun (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_RESTART_COUNT``),
else it is a non-distributed process (rank 0 of 1). :func:`resolve_settings` picks the
job name and folders: the argument, else the environment
(``STORMWATCH_JOB``/``TORCHELASTIC_RUN_ID``/``SLURM_JOB_NAME``, ``STORMWATCH_METRICS_DIR``,
``STORMWATCH_LOG_DIR``, ``STORMWATCH_DUMP_DIR``), and probes each folder. Neither
raises: what is wrong comes back as one message per problem, naming the variable or
argument and the fix, for the caller to warn with. No torch import here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.telemetry.phases import PHASES

#: (launcher, rank, local rank, world size, restart count) variables, tried in order.
_LAUNCHERS = (
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"),
    ("srun", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_RESTART_COUNT"),
)
#: Folder argument -> its environment variable.
FOLDER_ENV = {
    "metrics_dir": "STORMWATCH_METRICS_DIR",
    "log_dir": "STORMWATCH_LOG_DIR",
    "dump_dir": "STORMWATCH_DUMP_DIR",
}


@dataclass(frozen=True, kw_only=True)
class Placement:
    """This process's place in its job.

    Attributes:
        rank: global rank.
        local_rank: rank on this node.
        world_size: ranks in the job.
        attempt: restarts so far (torchrun's, node-local; or Slurm's requeues).
        launcher: ``torchrun``, ``srun``, or ``none`` (a non-distributed process).
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    attempt: int = 0
    launcher: str = "none"


def _number(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "")
    if raw == "":
        return default
    value = int(raw)  # ValueError: the caller names the variable
    if value < 0:
        raise ValueError(raw)
    return value


def placement(environ: Mapping[str, str]) -> tuple[Placement, list[str]]:
    """This process's :class:`Placement` and the problems met reading it.

    A launcher whose variables do not parse (not integers, ``rank >= world size``) is
    skipped with a problem naming the variables; with none usable the process is rank 0
    of 1 (``launcher="none"``).
    """
    problems: list[str] = []
    for launcher, rank, local, world, restarts in _LAUNCHERS:
        if rank not in environ or world not in environ:
            continue
        try:
            found = Placement(
                rank=_number(environ, rank, 0),
                local_rank=_number(environ, local, 0),
                world_size=_number(environ, world, 1),
                attempt=_number(environ, restarts, 0),
                launcher=launcher,
            )
        except ValueError:
            problems.append(
                f"{rank}={environ.get(rank)!r}, {local}={environ.get(local)!r}, "
                f"{world}={environ.get(world)!r}, {restarts}={environ.get(restarts)!r}: "
                f"not non-negative integers; {launcher}'s placement is ignored"
            )
            continue
        if found.world_size < 1 or found.rank >= found.world_size:
            problems.append(
                f"{rank}={found.rank} / {world}={found.world_size}: need 0 <= {rank} < {world}; "
                f"{launcher}'s placement is ignored"
            )
            continue
        return found, problems
    return Placement(), problems


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What :func:`stormwatch.telemetry.init` was asked for, resolved.

    Attributes:
        job: ``training_job`` label of every metric and the event log's job.
        metrics_dir: prometheus-client multiprocess folder (the node agent's); ``None``: off.
        log_dir: folder of ``rank<R>.jsonl``; ``None``: off.
        dump_dir: folder of post-mortem dumps ``rank<R>.json``; ``None``: off.
        collectives: count the c10d collectives.
        flight_recorder: ring size of PyTorch's flight recorder (read into dumps); 0: off.
        handle_signals: flush and dump on SIGTERM, then chain to the previous handler.
        phase_bounds: phase -> seconds it may pause progress
            (:data:`stormwatch.telemetry.phases.PHASES` with ``STORMWATCH_PHASE_BOUNDS``).
    """

    job: str = "train"
    metrics_dir: Path | None = None
    log_dir: Path | None = None
    dump_dir: Path | None = None
    collectives: bool = True
    flight_recorder: int = 0
    handle_signals: bool = True
    phase_bounds: Mapping[str, float] = field(default_factory=dict)

    def phase_bound(self, name: str, *, given: float | None = None) -> float:
        """Seconds phase ``name`` may pause progress: this job's override, else the default
        (:data:`stormwatch.telemetry.phases.PHASES`); a bound ``given`` for one entry
        (``phase(name, bound_seconds=...)``) wins, but is at least the job's override.
        Raises ``KeyError`` for an unknown phase."""
        if given is not None:
            return max(given, self.phase_bounds.get(name, 0.0))
        return self.phase_bounds.get(name, PHASES[name].bound_seconds)


#: The pid of the rank's main process: set by the first process to start a session
#: (``init()``, or ``stormwatch run``'s bootstrap when the rank imports torch) and inherited
#: by the processes it starts (spawn/forkserver data-loader workers, helper subprocesses),
#: which then know they are not the rank although they see its ``RANK``/``STORMWATCH_*``.
OWNER_ENV = "STORMWATCH_RUN_RANK_PID"


def rank_owner(environ: Mapping[str, str], pid: int) -> int | None:
    """The live pid, other than ``pid``, that :data:`OWNER_ENV` names (this process was
    started by the rank); ``None`` when it names this process, nothing, or a dead one."""
    try:
        owner = int(environ.get(OWNER_ENV, ""))
    except ValueError:
        return None
    if owner == pid or owner <= 0:
        return None
    try:
        os.kill(owner, 0)
    except PermissionError:  # alive, another user's
        return owner
    except OSError:  # gone (a stale variable from a finished launcher): not an owner
        return None
    return owner


def probe_folder(path: Path) -> str | None:
    """Create ``path`` and write a hidden probe file in it; the reason it fails, else None."""
    probe = path / f".stormwatch-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


def resolve_folder(
    name: str, given: str | os.PathLike[str] | None, environ: Mapping[str, str]
) -> tuple[Path | None, str | None]:
    """The folder for argument ``name`` (the argument, else its variable) and a problem.

    A folder that cannot be created or written is ``None`` (that output is off) with a
    problem naming where it came from and the fix.
    """
    variable = FOLDER_ENV[name]
    source = name
    raw: str | os.PathLike[str] | None = given
    if raw is None:
        raw, source = environ.get(variable) or None, variable
    if raw is None:
        return None, None
    if not isinstance(raw, (str, os.PathLike)) or not os.fspath(raw):
        return None, f"{source}={raw!r}: not a folder path; that output is off (pass a path)"
    path = Path(raw).expanduser()
    reason = probe_folder(path)
    if reason is not None:
        return None, (
            f"{source}={str(path)!r} cannot be written ({reason}); that output is off "
            f"(pass a writable folder, or unset {variable})"
        )
    return path, None


#: Free bytes the metrics folder needs at init(): prometheus-client's multiprocess files
#: are memory-mapped, each created at 64 KiB (``prometheus_client.mmap_dict``'s
#: ``_INITIAL_MMAP_SIZE``) and doubled when full; a rank writes up to 8 (counter,
#: histogram, the gauge modes), and the collective series (per op and mesh dimension) grow
#: them a few times over: 64 KiB x 8 files x 8 = 4 MiB. A write into a mapped file on a
#: full filesystem is a SIGBUS, which kills the process.
MIN_METRICS_FREE_BYTES = 4 << 20


def metrics_space_problem(path: Path) -> str | None:
    """Why the metrics folder ``path`` is too full to use (below
    :data:`MIN_METRICS_FREE_BYTES` free, by ``os.statvfs``), else None."""
    try:
        stats = os.statvfs(path)
    except OSError:  # not measurable (no statvfs there): the folder was writable, use it
        return None
    free = stats.f_bavail * stats.f_frsize
    if free >= MIN_METRICS_FREE_BYTES:
        return None
    return (
        f"metrics_dir={str(path)!r} has {free // 1024} KiB free, under the "
        f"{MIN_METRICS_FREE_BYTES >> 20} MiB its memory-mapped files need (a full folder "
        "kills training with SIGBUS); metrics are off (free space there or make it larger, "
        "e.g. the tmpfs's size=)"
    )


def encodable_job(job: str, source: str) -> tuple[str, str | None]:
    """``job`` with characters UTF-8 cannot encode (lone surrogates: an environment that
    was not UTF-8) written as backslash escapes, and a problem naming ``source`` when any
    were; the node agent's exposition must encode every label as UTF-8."""
    try:
        job.encode("utf-8")
    except UnicodeEncodeError:
        fixed = job.encode("utf-8", "backslashreplace").decode("utf-8")
        return fixed, (
            f"{source}: the job name cannot be encoded as UTF-8 (an environment that is not "
            f"UTF-8?); using {fixed!r} (set the job name in UTF-8)"
        )
    return job, None


def resolve_job(given: object, environ: Mapping[str, str]) -> tuple[str, str | None]:
    """The job name, as the node agent names this rank: the argument, else
    ``STORMWATCH_JOB``, else torchrun's ``TORCHELASTIC_RUN_ID`` (the agent's default,
    :func:`stormwatch.contracts.rank_env.rank_env`), else ``SLURM_JOB_NAME``, else
    ``"train"``; with a problem when the argument is not a non-empty string, or differs
    from the name the agent reads from this process's environment (its metrics would
    not join the agent's view of the rank: heartbeats, exits)."""
    from_env = next(
        (
            environ[v]
            for v in ("STORMWATCH_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_NAME")
            if environ.get(v)
        ),
        "train",
    )
    if given is None:
        return from_env, None
    if not (isinstance(given, str) and given.strip()):
        return from_env, f"job={given!r}: not a non-empty string; using {from_env!r}"
    agent_sees = environ.get("STORMWATCH_JOB") or environ.get("TORCHELASTIC_RUN_ID")
    if agent_sees is not None and agent_sees != given:
        return given, (
            f"job={given!r} differs from the name the node agent reads from this "
            f"process's environment ({agent_sees!r}): set STORMWATCH_JOB={given} where the "
            f"job is launched so the agent joins them"
        )
    return given, None


__all__ = [
    "FOLDER_ENV",
    "MIN_METRICS_FREE_BYTES",
    "OWNER_ENV",
    "Placement",
    "Settings",
    "encodable_job",
    "metrics_space_problem",
    "placement",
    "probe_folder",
    "rank_owner",
    "resolve_folder",
    "resolve_job",
]
