"""Zero-code mode: ``stormwatch run [options] -- <command...>`` instruments an unmodified job.

How (docs/instrument-your-job.md, "Zero-code mode"):

1. :mod:`.cli` resolves the job name and the folders (:mod:`.environ`: options, else the
   ``STORMWATCH_*`` variables, else the node agent's metrics folder), creates them, and
   *replaces itself* with the command (``execve``): the command keeps the launcher's pid,
   its signals and its exit status, as if it had been started directly.
2. The command's environment has the bootstrap folder (:data:`.environ.BOOTSTRAP_DIR`)
   first on ``PYTHONPATH``. Every Python process of the job imports its ``sitecustomize``
   at start-up; it chains any other ``sitecustomize`` on the path and returns at once in
   a process that is not a rank (torchrun itself, a data-loader worker, a tool), without
   importing stormwatch or torch.
3. In a rank's main process it calls :func:`.rank.start`, which waits for the job to
   import torch (:mod:`.afterimport`) and then calls ``stormwatch.telemetry.init()``
   (collective counting is installed when the job calls ``init_process_group``; the
   flight recorder; the SIGTERM dump; the dump-request watcher of
   :mod:`stormwatch.telemetry.dump_requests`, through which the node agent asks a hung
   job's ranks for their flight recorders).

What a job gets this way and what needs the API (loss, tokens, step boundaries, phases)
is in the docs. Nothing here imports torch.
"""

from stormwatch.telemetry.zerocode.environ import (
    BOOTSTRAP_DIR,
    RUN_ID_ENV,
    RunSettings,
    child_environ,
    resolve_command,
    resolve_settings,
)

__all__ = [
    "BOOTSTRAP_DIR",
    "RUN_ID_ENV",
    "RunSettings",
    "child_environ",
    "resolve_command",
    "resolve_settings",
]
