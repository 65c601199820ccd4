"""``stormwatch run [options] -- <command...>``: run an unmodified job with telemetry.

The launcher resolves its settings (:mod:`.environ`), creates the folders, and then
*becomes* the command (``execve``, as ``exec`` in a shell): the command keeps this
process's pid, so a signal sent to ``stormwatch run`` (by a shell, srun, a scheduler)
reaches the command itself, and its exit status (a code, or death by a signal) is the
one the caller sees. Nothing is left in between to forward, reap or translate.
A mistake (no command, a command that is not found or not executable, a folder that
cannot be written) is one line on stderr and exit status 2, before anything runs.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import click

from stormwatch.errors import ConfigError
from stormwatch.telemetry.dump import DEFAULT_FLIGHT_RECORDER_ENTRIES, MAX_FLIGHT_RECORDER_ENTRIES
from stormwatch.telemetry.zerocode.environ import (
    child_environ,
    prepare_folders,
    resolve_command,
    resolve_settings,
)

#: Signals Python sets to "ignore" at start-up; ``exec`` would pass that on to the
#: command, so they go back to the default first (as ``subprocess``'s ``restore_signals``).
_PYTHON_IGNORED = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name)
)

_FOLDER = click.Path(file_okay=False, path_type=Path)


@click.command(
    "run",
    # Options end at the first word of the command (or at --): its own options are its.
    context_settings={"help_option_names": ["-h", "--help"], "allow_interspersed_args": False},
)
@click.option(
    "--job",
    help="Job name [env STORMWATCH_JOB, else each rank's TORCHELASTIC_RUN_ID (torchrun's "
    "--rdzv-id; a random id under --standalone), else SLURM_JOB_NAME, else train].",
)
@click.option(
    "--metrics-dir",
    type=_FOLDER,
    help="The node agent's metrics folder [env STORMWATCH_METRICS_DIR, else "
    "STORMWATCH_AGENT_METRICS_DIR, else /run/stormwatch/metrics if it exists]; "
    "%n becomes the node's name.",
)
@click.option("--log-dir", type=_FOLDER, help="Rank event logs [env STORMWATCH_LOG_DIR; off].")
@click.option(
    "--dump-dir",
    type=_FOLDER,
    help="Post-mortem dumps (flight recorder) [env STORMWATCH_DUMP_DIR, else <log-dir>/dumps, "
    "else <metrics-dir>/dumps].",
)
@click.option(
    "--flight-recorder-entries",
    type=click.IntRange(min=0, max=MAX_FLIGHT_RECORDER_ENTRIES),
    default=DEFAULT_FLIGHT_RECORDER_ENTRIES,
    show_default=True,
    help="PyTorch flight-recorder ring size (0: off; at most 1000000; TORCH_FR_BUFFER_SIZE wins).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(
    job: str | None,
    metrics_dir: Path | None,
    log_dir: Path | None,
    dump_dir: Path | None,
    flight_recorder_entries: int,
    command: tuple[str, ...],
) -> NoReturn:
    """Run COMMAND so that every rank it starts has stormwatch telemetry, unmodified.

    Each rank (a torchrun worker, or an srun task) counts its collectives (calls, bytes,
    latency, algbw/busbw), beats a heartbeat on every completed collective, and keeps
    PyTorch's flight recorder for the node agent's hang diagnosis; the node agent sees
    its start, exit and exit reason. Loss, tokens and step times need the API
    (docs/instrument-your-job.md).

    \b
    Examples:
      stormwatch run -- torchrun --nproc-per-node 8 train.py --lr 3e-4
      srun --ntasks-per-node 8 stormwatch run --job llm -- python train.py
    """
    settings, warnings = resolve_settings(
        command,
        environ=os.environ,
        job=job,
        metrics_dir=metrics_dir,
        log_dir=log_dir,
        dump_dir=dump_dir,
        flight_recorder_entries=flight_recorder_entries,
    )
    env = child_environ(settings, os.environ)
    executable = resolve_command(settings.command, env)
    prepare_folders(settings)
    for warning in warnings:
        click.echo(f"stormwatch run: {warning}", err=True)
    exec_command(executable, settings.command, env)


def exec_command(executable: str, argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """Replace this process with ``argv`` (``executable`` resolved), signals as at start-up.

    Raises:
        ConfigError: the kernel refused to run it (not a program, no permission, ...).
    """
    for number in _PYTHON_IGNORED:
        signal.signal(number, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(executable, list(argv), dict(env))
    except OSError as exc:
        raise ConfigError(
            f"command {argv[0]!r} cannot be run ({exc.strerror or exc}): "
            "give a program this user can execute"
        ) from exc


__all__ = ["exec_command", "run"]
