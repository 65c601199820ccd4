"""What ``stormwatch run``'s bootstrap does in a rank: start telemetry, once per rank.

:func:`start` is called by the bootstrap ``sitecustomize`` in every Python process whose
environment names a rank. It acts only in the rank's *main* process:

* not in torchrun's own process (under ``srun ... stormwatch run -- bash job.sh`` the
  launcher's environment can name a Slurm rank too);
* not in a process that a rank started (a data-loader worker, a tool run with
  ``sys.executable``): the rank notes its pid in :data:`OWNER_ENV`, which those inherit;
  a process that finds another pid there is not the rank.

In the rank, once the job has imported torch (:mod:`.afterimport`; the bootstrap itself
imports no torch, which a job may configure through variables it sets before its own
``import torch``), it calls ``stormwatch.telemetry.init()`` with its defaults: the job,
folders and placement from the environment ``stormwatch run`` prepared, collectives
counted from ``init_process_group`` on, the flight recorder, the SIGTERM dump. A job that
calls ``init()`` itself gets that same session back (with the defaults, no warning), and
one that called it before importing torch keeps its own. Either session answers the node
agent's dump requests (:mod:`stormwatch.telemetry.dump_requests`). Nothing here raises into the job: a failure is one
warning on the ``stormwatch.telemetry`` logger and the job runs without.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping, Sequence
from types import ModuleType

from stormwatch.contracts.rank_env import is_torchrun_agent
from stormwatch.telemetry.lifecycle.launch import OWNER_ENV
from stormwatch.telemetry.zerocode.afterimport import after_import

log = logging.getLogger("stormwatch.telemetry")


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
    """Start telemetry in this rank when it imports torch (see the module docstring);
    whether this is a rank's main process."""
    environ = os.environ if environ is None else environ
    argv = sys.orig_argv if argv is None else argv
    pid = os.getpid()
    if not is_rank_main_process(environ, argv, pid):
        return False
    environ[OWNER_ENV] = str(pid)
    after_import("torch", _start_session)
    return True


def _start_session(_: ModuleType) -> None:
    """The rank's session (the job's own if it made one already; either answers the node
    agent's dump requests)."""
    try:
        import stormwatch.telemetry as swt

        session = swt.session()
        if session is None:  # ours: started once the process group is up (the job's: left)
            session = swt.init()
            session.start_with_counting()
    except Exception:  # the job must run even when its telemetry cannot
        log.warning(
            "stormwatch run: telemetry could not start in pid %d", os.getpid(), exc_info=True
        )


__all__ = ["OWNER_ENV", "is_rank_main_process", "start"]
