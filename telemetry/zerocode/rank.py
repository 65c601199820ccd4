"""What ``stormwatch run``'s bootstrap does in a rank: start telemetry, once per rank.

:func:`start` is called by the bootstrap ``sitecustomize`` in every Python process whose
environment names a rank. It acts only in the rank's *main* process:

* not in torchrun's own process (under ``srun ... stormwatch run -- bash job.sh`` the
  launcher's environment can name a Slurm rank too);
* not in a process that a rank started (a data-loader worker, a tool run with
  ``sys.executable``): the rank notes its pid in :data:`OWNER_ENV`, which those inherit;
  a process that finds another pid there is not the rank.

In the rank it calls ``stormwatch.telemetry.init(collectives=False, flight_recorder=True)``
(the job, folders and placement come from the environment ``stormwatch run`` prepared),
asks for :func:`stormwatch.telemetry.instrument_collectives` once the job has imported
torch (:mod:`.afterimport`: ``init(collectives=True)`` would import ``torch.distributed``
at once, before the job's own set-up), so counting is in place when the job calls
``init_process_group``, and starts answering the node agent's dump requests
(:mod:`.dumps`). It never raises: a failure is one warning on the ``stormwatch.telemetry``
logger and the job runs without.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping, Sequence

from stormwatch.contracts.rank_env import is_torchrun_agent
from stormwatch.telemetry.zerocode.afterimport import after_import
from stormwatch.telemetry.zerocode.dumps import DumpRequestWatcher

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

        session = swt.init(collectives=False, flight_recorder=True)
        after_import("torch", lambda _: swt.instrument_collectives())
        if session.settings.dump_dir is not None:
            DumpRequestWatcher(session.settings.dump_dir, session.rank, session.dump).start()
    except Exception:  # the job must run even when its telemetry cannot
        log.warning("stormwatch run: telemetry could not start in pid %d", pid, exc_info=True)
        return False
    return True


__all__ = ["OWNER_ENV", "is_rank_main_process", "start"]
