"""The settings of ``stormwatch run`` and the environment it gives the job's command.

Precedence (STYLE.md): defaults < environment < options.

* job: ``--job``, else ``STORMWATCH_JOB``, else ``SLURM_JOB_NAME``, else ``train`` (the
  names :func:`stormwatch.telemetry.init` falls back on). The launcher always exports
  ``STORMWATCH_JOB``, so the node agent's rank key (``STORMWATCH_JOB``, else torchrun's
  run id: :func:`stormwatch.contracts.rank_env.rank_env`) and the ``training_job`` label of
  the metrics agree.
* metrics folder (the node agent's ``--metrics-dir``): ``--metrics-dir``, else
  ``STORMWATCH_METRICS_DIR`` (what the lab, deploy/slurm/train.sbatch and the Kubernetes
  manifests give ranks), else ``STORMWATCH_AGENT_METRICS_DIR`` (the agent's own setting,
  where its environment file is exported on the node), else ``/run/stormwatch/metrics``
  when that folder exists (where the deployment recipes mount it); none: the job runs
  without metrics and the launcher says so. ``%n`` in it becomes the node's name
  (``SLURMD_NODENAME``, else the short host name), as in train.sbatch.
* log folder (``rank<R>.jsonl``): ``--log-dir``, else ``STORMWATCH_LOG_DIR``; none: off.
* dump folder (``rank<R>.attempt<A>.pid<P>.json``, flight recorders): ``--dump-dir``, else
  ``STORMWATCH_DUMP_DIR``, else ``<log folder>/dumps`` (where the incident post-mortem
  reads them), else ``<metrics folder>/dumps``.
* flight-recorder entries: ``--flight-recorder-entries`` (default 2000, as
  ``stormwatch train``; 0: off). The variables are set only when the user has not set them.

Under ``srun`` with no torchrun in between (``srun ... stormwatch run -- python train.py``:
each Slurm task is a rank) the launcher also exports ``STORMWATCH_RUN_ID`` =
``<SLURM_JOB_ID>.<SLURM_STEP_ID>``: with it, the node agent takes the task for a rank
(identity from ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``), as torchrun's
``TORCHELASTIC_RUN_ID`` marks torchrun's workers. It is not set when the command is
torchrun itself (its workers are the ranks).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.contracts.rank_env import RUN_ID_ENV, is_torchrun_agent
from stormwatch.errors import ConfigError
from stormwatch.telemetry.dump import (
    DEFAULT_FLIGHT_RECORDER_ENTRIES,
    MAX_FLIGHT_RECORDER_ENTRIES,
    flight_recorder_environ,
)
from stormwatch.telemetry.lifecycle.launch import encodable_job

#: The folder whose ``sitecustomize.py`` starts telemetry in each rank (first on PYTHONPATH).
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
#: The node agent's own setting of its metrics folder (``stormwatch agent run``).
AGENT_METRICS_DIR_ENV = "STORMWATCH_AGENT_METRICS_DIR"
#: Where deploy/kubernetes and the agent's example mount the node's metrics folder.
CONVENTIONAL_METRICS_DIR = Path("/run/stormwatch/metrics")


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What ``stormwatch run`` was asked for, resolved (see the module docstring).

    Attributes:
        command: the job's command line (``argv``, at least one word).
        job: the job's name.
        metrics_dir, log_dir, dump_dir: the folders (``None``: that output is off).
        flight_recorder_entries: PyTorch flight-recorder ring size (0: not enabled).
        sources: folder name (``metrics_dir``...) -> where it came from (``--metrics-dir``,
            ``STORMWATCH_METRICS_DIR``...), for messages.
    """

    command: tuple[str, ...]
    job: str
    metrics_dir: Path | None = None
    log_dir: Path | None = None
    dump_dir: Path | None = None
    flight_recorder_entries: int = DEFAULT_FLIGHT_RECORDER_ENTRIES
    sources: Mapping[str, str] = field(default_factory=dict)


def _node_name(environ: Mapping[str, str]) -> str:
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _first(
    candidates: Sequence[tuple[str, str | os.PathLike[str] | None]],
) -> tuple[str | None, str | None]:
    """``(value, source)`` of the first candidate that is set and not empty."""
    for source, value in candidates:
        text = "" if value is None else os.fspath(value)
        if text:
            return text, source
    return None, None


def _job_name(job: str | None, environ: Mapping[str, str]) -> tuple[str, str | None]:
    """The job name (``--job``, else ``STORMWATCH_JOB``, else ``SLURM_JOB_NAME``, else
    ``train``), escaped where UTF-8 cannot encode it, and that problem if so.

    Raises:
        ConfigError: ``job`` begins with ``-``: ``--job`` was given no name, and the next
            word (``--``, or the command's first option) was taken for it.
    """
    if job is not None and job.startswith("-"):
        # `stormwatch run --job -- python train.py`: click took `--` (or the command's first
        # option) as the job's name, and the command would run under it.
        raise ConfigError(
            f"--job: {job!r} is not a job name (the name is missing?): give one, e.g. "
            "stormwatch run --job llm -- python train.py"
        )
    name, source = _first(
        [
            ("--job", job),
            ("STORMWATCH_JOB", environ.get("STORMWATCH_JOB")),
            ("SLURM_JOB_NAME", environ.get("SLURM_JOB_NAME")),
        ]
    )
    if not name:
        return "train", None
    return encodable_job(name, source or "--job")


def resolve_settings(
    command: Sequence[str],
    *,
    environ: Mapping[str, str],
    job: str | None = None,
    metrics_dir: Path | None = None,
    log_dir: Path | None = None,
    dump_dir: Path | None = None,
    flight_recorder_entries: int = DEFAULT_FLIGHT_RECORDER_ENTRIES,
) -> tuple[RunSettings, list[str]]:
    """The run's settings, and warnings to show (one line each). Nothing is created here.

    Raises:
        ConfigError: no command, ``--job`` given no name (:func:`_job_name`), or
            ``flight_recorder_entries`` outside 0 to ``MAX_FLIGHT_RECORDER_ENTRIES`` (names
            the option).
    """
    if not command:
        raise ConfigError(
            "no command to run: put the job's command after --, e.g. "
            "stormwatch run -- torchrun --nproc-per-node 2 train.py"
        )
    if not 0 <= flight_recorder_entries <= MAX_FLIGHT_RECORDER_ENTRIES:
        raise ConfigError(
            f"--flight-recorder-entries: must be 0 to {MAX_FLIGHT_RECORDER_ENTRIES} "
            f"(got {flight_recorder_entries})"
        )
    warnings = _no_launcher(command, environ)
    name, problem = _job_name(job, environ)
    if problem:
        warnings.append(problem)
    raw_metrics, metrics_source = _first(
        [
            ("--metrics-dir", metrics_dir),
            ("STORMWATCH_METRICS_DIR", environ.get("STORMWATCH_METRICS_DIR")),
            (AGENT_METRICS_DIR_ENV, environ.get(AGENT_METRICS_DIR_ENV)),
        ]
    )
    if raw_metrics is None and CONVENTIONAL_METRICS_DIR.is_dir():
        raw_metrics, metrics_source = str(CONVENTIONAL_METRICS_DIR), "the node's default"
    if raw_metrics is None:
        warnings.append(
            "no metrics folder (--metrics-dir, STORMWATCH_METRICS_DIR or the node agent's "
            "STORMWATCH_AGENT_METRICS_DIR): the node agent will not see this job's "
            "collectives, heartbeats or hangs; pass the agent's --metrics-dir"
        )
    metrics = Path(raw_metrics.replace("%n", _node_name(environ))) if raw_metrics else None
    raw_log, log_source = _first(
        [("--log-dir", log_dir), ("STORMWATCH_LOG_DIR", environ.get("STORMWATCH_LOG_DIR"))]
    )
    logs = Path(raw_log) if raw_log else None
    raw_dump, dump_source = _first(
        [
            ("--dump-dir", dump_dir),
            ("STORMWATCH_DUMP_DIR", environ.get("STORMWATCH_DUMP_DIR")),
            (f"{log_source} + /dumps", logs / "dumps" if logs else None),
            (f"{metrics_source} + /dumps", metrics / "dumps" if metrics else None),
        ]
    )
    sources = {
        name: source
        for name, source in (
            ("metrics_dir", metrics_source),
            ("log_dir", log_source),
            ("dump_dir", dump_source),
        )
        if source is not None
    }
    settings = RunSettings(
        command=tuple(command),
        job=name,
        metrics_dir=metrics,
        log_dir=logs,
        dump_dir=Path(raw_dump) if raw_dump else None,
        flight_recorder_entries=flight_recorder_entries,
        sources=sources,
    )
    return settings, warnings


_NO_LAUNCHER = (
    "{program}: no launcher starts it (torchrun, srun) and no RANK or SLURM_PROCID is set, "
    "so no process of it is a rank and nothing is recorded; run it under one, e.g. "
    "stormwatch run -- torchrun --nproc-per-node 1 {args}"
)


def _no_launcher(command: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """The warning for a command that runs a Python program straight (``python train.py``,
    not ``python -m torch.distributed.run``) with no launcher's rank variables around it:
    the bootstrap then finds no rank (a script such as ``bash job.sh`` may start one
    itself, so only a direct Python command is judged); else none."""
    word = Path(command[0]).name
    python = word == "python" or re.fullmatch(r"python3(\.\d+)?", word) is not None
    if not python or is_torchrun_agent(word, command):
        return []
    if any(name in environ for name in ("RANK", "SLURM_PROCID")):
        return []
    return [_NO_LAUNCHER.format(program=" ".join(command[:2]), args=" ".join(command[1:]))]


def prepare_folders(settings: RunSettings) -> None:
    """Create every folder of ``settings`` and check it can be written (a probe file).

    Raises:
        ConfigError: a folder cannot be created or written; names the option or variable
            it came from and the fix.
    """
    for name in ("metrics_dir", "log_dir", "dump_dir"):
        path: Path | None = getattr(settings, name)
        if path is None:
            continue
        probe = path / f".stormwatch-probe-{os.getpid()}"
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            source = settings.sources.get(name, name)
            raise ConfigError(
                f"{source}: {str(path)!r} cannot be written ({exc.strerror or exc}); "
                "pass a folder this user can write"
            ) from exc


def is_srun_task(environ: Mapping[str, str]) -> bool:
    """Whether this process is a Slurm task of an ``srun`` step and not already a rank of
    a launcher inside it (no ``RANK``)."""
    return "SLURM_PROCID" in environ and "SLURM_STEP_ID" in environ and "RANK" not in environ


def child_environ(settings: RunSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: ``environ`` plus the bootstrap first on ``PYTHONPATH``,
    ``STORMWATCH_JOB`` and the folders' ``STORMWATCH_*`` variables, the flight-recorder
    variables the user has not set, and ``STORMWATCH_RUN_ID`` for a rank started by srun
    directly (see the module docstring).

    ``environ`` is the launcher's own environment (``os.environ``, which
    :func:`~stormwatch.telemetry.dump.flight_recorder_environ` also reads: a buffer size set
    under either of torch's names is the user's choice and is kept).
    """
    env = dict(environ)
    bootstrap = str(BOOTSTRAP_DIR)
    # an empty entry ("a::b", a leading or trailing ":") means the current folder: kept
    given = env.get("PYTHONPATH", "")
    paths = [p for p in given.split(os.pathsep) if p != bootstrap] if given else []
    env["PYTHONPATH"] = os.pathsep.join([bootstrap, *paths])
    env["STORMWATCH_JOB"] = settings.job
    for name, variable in (
        ("metrics_dir", "STORMWATCH_METRICS_DIR"),
        ("log_dir", "STORMWATCH_LOG_DIR"),
        ("dump_dir", "STORMWATCH_DUMP_DIR"),
    ):
        path: Path | None = getattr(settings, name)
        if path is not None:
            env[variable] = str(path.resolve())
    dump = Path(env["STORMWATCH_DUMP_DIR"]) if settings.dump_dir is not None else None
    for key, value in flight_recorder_environ(dump, settings.flight_recorder_entries).items():
        env.setdefault(key, value)
    command = settings.command
    if is_srun_task(environ) and not is_torchrun_agent(Path(command[0]).name, command):
        env[RUN_ID_ENV] = f"{environ.get('SLURM_JOB_ID', '0')}.{environ['SLURM_STEP_ID']}"
    return env


def resolve_command(command: Sequence[str], env: Mapping[str, str]) -> str:
    """The executable ``command[0]`` names, looked up on ``env``'s ``PATH`` as ``execvp`` does.

    Raises:
        ConfigError: nothing executable by that name (names it and the fix).
    """
    word = command[0]
    found = shutil.which(word, path=env.get("PATH", os.defpath))
    if found is not None:
        return found
    if os.sep in word:
        why = "is a folder" if os.path.isdir(word) else "is not an executable file"
        raise ConfigError(f"command {word!r} {why}: give the path of a program (chmod +x it)")
    raise ConfigError(
        f"command {word!r} not found on PATH: give its path, or activate the environment "
        "that has it"
    )


__all__ = [
    "AGENT_METRICS_DIR_ENV",
    "BOOTSTRAP_DIR",
    "CONVENTIONAL_METRICS_DIR",
    "RUN_ID_ENV",
    "RunSettings",
    "child_environ",
    "is_srun_task",
    "prepare_folders",
    "resolve_command",
    "resolve_settings",
]
