"""What ``stormwatch run``'s bootstrap does in a rank: start telemetry, once per rank.

:func:`start` is called by the bootstrap ``sitecustomize`` in every Python process whose
environment names a rank. It acts only in the rank's *main* process:

* not in torchrun's own process (under ``srun ... stormwatch run -- bash job.sh`` the
  launcher's environment can name a Slurm rank too);
* not in a process that a rank started (a data-loader worker, a tool run with
  ``sys.executable``): the rank notes its pid in :data:`OWNER_ENV`, which those inherit;
  a process that finds another pid there is not the rank.

In the rank it calls ``stormwatch.telemetry.init(collectives=True, flight_recorder=True)``
(the job, folders and placement come from the environment ``stormwatch run`` prepared)
and starts answering the node agent's dump requests (:mod:`.dumps`). It never raises:
a failure is one warning on the ``stormwatch.telemetry`` logger and the job runs without.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping, Sequence
from pathlib import Path

from stormwatch.contracts.rank_env import is_torchrun_agent

log = logging.getLogger("stormwatch.telemetry")

#: The pid of the rank's main process, inherited by the processes it starts.
OWNER_ENV = "STORMWATCH_RUN_RANK_PID"


def is_rank_main_process(environ: MutableMapping[str, str], argv: Sequence[str], pid: int) -> bool:
    """Whether this process (``argv``: ``sys.orig_argv``) is a rank's main process (see the
    module docstring); its environment is assumed to name a rank."""
    if is_torchrun_agent("", argv):
        return False
    owner = environ.get(OWNER_ENV)
    return owner is None or owner == str(pid)


def start(
    environ: MutableMapping[str, str] | None = None, argv: Sequence[str] | None = None
) -> bool:
    """Start telemetry in this rank (see the module docstring); whether it was started."""
    environ = os.environ if environ is None else environ
    argv = sys.orig_argv if argv is None else argv
    pid = os.getpid()
    if not is_rank_main_process(environ, argv, pid):
        return False
    environ[OWNER_ENV] = str(pid)
    try:
        import stormwatch.telemetry as swt

        session = swt.init(collectives=True, flight_recorder=True)
    except Exception:  # the job must run even when its telemetry cannot
        log.warning("stormwatch run: telemetry could not start in pid %d", pid, exc_info=True)
        return False
    _answer_dump_requests(session)
    return True


def _answer_dump_requests(session: object) -> None:
    from stormwatch.telemetry.zerocode.dumps import DumpRequestWatcher

    dump_dir = getattr(session, "dump_dir", None)
    rank = getattr(session, "rank", None)
    dump = getattr(session, "dump", None)
    if dump_dir is None or rank is None or dump is None:
        return  # dumps are off (no folder), or this session cannot dump
    DumpRequestWatcher(Path(dump_dir), int(rank), dump).start()


__all__ = ["OWNER_ENV", "is_rank_main_process", "start"]
