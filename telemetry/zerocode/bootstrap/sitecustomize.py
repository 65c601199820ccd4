"""``stormwatch run``'s start-up hook, imported first by every Python process of the job.

``stormwatch run`` puts this folder first on ``PYTHONPATH``, so :mod:`site` imports this
``sitecustomize`` in each Python process the job starts (not under ``python -S``, ``-I``
or ``-E``). It

1. runs the ``sitecustomize`` it shadows, when there is one further along ``sys.path``
   (an error in that one is reported as :mod:`site` reports it, and this one goes on);
2. returns at once, importing nothing, in a process whose environment names no rank
   (torchrun's launcher, a shell tool): neither torchrun's ``RANK`` and ``WORLD_SIZE``
   nor an srun task marked by ``stormwatch run`` (``STORMWATCH_RUN_ID`` with
   ``SLURM_PROCID``);
3. otherwise hands over to :func:`stormwatch.telemetry.zerocode.rank.start`, which
   returns without doing anything in a process a rank started (a data-loader worker)
   and starts telemetry in the rank's main process. It never raises: a Python that cannot
   import stormwatch prints one line and the job runs without telemetry.

Standard library and a few environment reads only: every Python process pays for it.
Imported under its package name (documentation, tests) it does nothing.
"""

import os
import sys
from collections.abc import Mapping


def _run_shadowed() -> None:
    """Execute the next ``sitecustomize`` on ``sys.path`` (the one this folder shadows)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    this = sys.modules.get(__name__)
    sys.modules[__name__] = module  # what it sees while it runs, as if imported by site
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # reported like site.execsitecustomize; ours still runs
        sys.stderr.write(
            "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
            f"{type(exc).__name__}: {exc}\n"
        )
    finally:
        if this is not None:
            sys.modules[__name__] = this
    globals()["shadowed"] = module


def _names_a_rank(environ: Mapping[str, str]) -> bool:
    torchrun_worker = "RANK" in environ and "WORLD_SIZE" in environ
    srun_task = "STORMWATCH_RUN_ID" in environ and "SLURM_PROCID" in environ
    return torchrun_worker or srun_task


def _start() -> None:
    if not _names_a_rank(os.environ):
        return
    try:
        from stormwatch.telemetry.zerocode import rank
    except Exception as exc:  # another Python than stormwatch's: the job runs as it is
        sys.stderr.write(
            f"stormwatch run: {sys.executable} cannot import stormwatch "
            f"({type(exc).__name__}: {exc}); this process runs without telemetry\n"
        )
        return
    rank.start()


if __name__ == "sitecustomize":  # imported by site, not as a module of the package
    _run_shadowed()
    _start()
