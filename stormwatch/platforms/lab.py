"""The lab's platform backend: local processes in one PID namespace.

The lab backend finds a job's workers the way the agent's rank watcher does
(their environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``TORCHELASTIC_RUN_ID``, job = ``STORMWATCH_JOB``; see docs/ARCHITECTURE.md):

* restart workers: SIGTERM to every worker of the job, SIGKILL to what of them (and their
  children) still runs after the grace period, and the answer only once every one is gone
  (:mod:`.stopping`); torchrun sees the worker group fail and restarts it (within
  ``--max-restarts``; it starts the new group only after the old one exited);
* exclude a node: SIGTERM to the job's torchrun agents on that node (they stop their
  workers) and to its workers that outlived their torchrun (adopted by init), SIGKILL to
  the agents and workers (and their children) still running after the grace period, until
  all are gone; the remaining agents re-rendezvous at the smaller world size (needs
  torchrun ``--nnodes MIN:MAX`` with MIN below the current node count);
* checkpoint now: the trainer's control channel, ``<control-dir>/rank<R>.json``
  (``STORMWATCH_CONTROL_DIR``, default ``<STORMWATCH_METRICS_DIR>/control``):
  adds ``{"point": "checkpoint_now", "requested_at": T}`` to the file's
  ``faults`` list, keeping the entries already armed (chaos faults); arming it
  on one rank is enough (the ranks agree in the gradient-norm all-reduce);
* collect diagnostics: per worker its status, kernel wait channel and stack,
  and ``py-spy dump`` when installed, written to
  ``<diagnostics_dir>/incident-<id>.json``.

What the backend knows of the lab (its nodes and their metrics directories, ranks per
node, its Prometheus) comes from the target file ``lab up`` writes in the run directory
(:func:`read_lab_target`, :data:`LAB_TARGET_FILE`: its ``lab:`` section, in a ``lab``
target or in the Slurm lab's ``slurm`` target), never from ``lab.json``: the lab imports
this package (it builds the file from :mod:`.targets`), so this package cannot import the
lab back. On the Slurm lab this backend serves only the jobs the lab launched directly
(:class:`~.lab_slurm.LabSlurmBackend`).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from stormwatch.contracts.rank_env import rank_env
from stormwatch.platforms.base import arm_checkpoint, report_diagnostics
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.stopping import DEFAULT_GRACE_PERIOD_S, require_gone, stop_processes
from stormwatch.platforms.targets import LabSection, TargetFile, load_target_file

log = logging.getLogger(__name__)

#: Seconds ``py-spy dump`` may take per process.
PY_SPY_TIMEOUT_S = 20.0
#: The target file ``lab up`` writes in its run directory (the lab's ``RunPaths.target_file``).
LAB_TARGET_FILE = "target.yaml"


def lab_target_path(run_dir: Path) -> Path:
    """``<run_dir>/target.yaml``, where ``lab up`` writes the lab's target file."""
    return Path(run_dir) / LAB_TARGET_FILE


def read_lab_target(run_dir: Path) -> TargetFile | None:
    """The target file ``lab up`` wrote in ``run_dir``; None when there is none.

    Raises:
        InvalidTargetFile: it exists but cannot be read or is not a valid target file
            (the message names the file, and the field).
    """
    path = lab_target_path(run_dir)
    if not path.exists() and not path.is_symlink():
        return None
    return load_target_file(path)


def lab_placement(lab: LabSection) -> dict[int, str]:
    """Global rank -> node as the lab places a job's ranks (torchrun, node by node,
    ``nproc_per_node`` each, in the section's node order): the placement of a job that may
    have ended (post-mortems); :meth:`LabBackend.ranks` reads the live workers instead."""
    per_node = lab.nproc_per_node
    return {
        i * per_node + local: node.name
        for i, node in enumerate(lab.nodes)
        for local in range(per_node)
    }


@dataclass(frozen=True)
class Worker:
    """One live worker process of a job."""

    pid: int
    ppid: int
    rank: int
    node: str | None
    environ: Mapping[str, str]

    @property
    def control_dir(self) -> Path | None:
        """The trainer's control directory (docs/ARCHITECTURE.md), or None when unknown."""
        explicit = self.environ.get("STORMWATCH_CONTROL_DIR")
        if explicit:
            return Path(explicit)
        metrics = self.environ.get("STORMWATCH_METRICS_DIR")
        return Path(metrics) / "control" if metrics else None


def _resolved(path: Path) -> str | None:
    """``path`` resolved (symlinks, ``..``); ``None`` when it cannot be (a symlink loop)."""
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11)
        return None


def _worker_metrics_dir(proc: psutil.Process, environ: Mapping[str, str]) -> str | None:
    """The worker's ``STORMWATCH_METRICS_DIR``, resolved; a relative one against the worker's
    own working directory, not this process's. ``None`` when unset or not resolvable."""
    metrics = environ.get("STORMWATCH_METRICS_DIR")
    if not metrics:
        return None
    path = Path(metrics)
    if not path.is_absolute():
        try:
            path = Path(proc.cwd()) / path
        except (psutil.Error, OSError):
            return None
    return _resolved(path)


@dataclass(frozen=True, kw_only=True)
class LabBackend:
    """The lab's backend (local processes, one PID namespace).

    Attributes:
        diagnostics_dir: where ``collect_diagnostics`` writes (created on demand).
        node_metrics_dirs: node name -> its metrics directory (``LabState``
            nodes), to tell which node a worker runs on; a worker whose
            ``STORMWATCH_METRICS_DIR`` is not listed has no node.
        grace_period_s: seconds from SIGTERM to SIGKILL of a restart or exclusion
            (:mod:`.stopping`; :meth:`for_lab`: the lab's target file's).
        clock: Unix time source (seconds), for ``requested_at``.
    """

    diagnostics_dir: Path
    node_metrics_dirs: Mapping[str, Path] = field(default_factory=dict)
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S
    clock: Callable[[], float] = time.time

    @classmethod
    def for_lab(cls, run_dir: Path, *, diagnostics_dir: Path) -> LabBackend:
        """The backend of the lab in ``run_dir``: node -> metrics directory from the ``lab:``
        section of the target file ``lab up`` wrote there (:func:`read_lab_target`; a ``lab``
        or the Slurm lab's ``slurm`` target), and its ``grace_period_s``; no node map (and
        the default grace period) without one.

        Raises:
            InvalidTargetFile: the lab's target file is not readable or not valid.
        """
        target = read_lab_target(run_dir)
        lab = target.lab if target is not None else None
        nodes = {} if lab is None else {n.name: n.metrics_dir for n in lab.nodes}
        grace = DEFAULT_GRACE_PERIOD_S if target is None else target.grace_period_s
        return cls(diagnostics_dir=diagnostics_dir, node_metrics_dirs=nodes, grace_period_s=grace)

    def workers(self, job: str) -> list[Worker]:
        """The job's live workers, by rank.

        When the lab's nodes are known (:attr:`node_metrics_dirs`), only workers whose
        ``STORMWATCH_METRICS_DIR`` is one of theirs count: a job of the same name run by
        another lab or user on this machine is not this lab's to signal."""
        by_dir = {key: n for n, p in self.node_metrics_dirs.items() if (key := _resolved(Path(p)))}
        found = []
        for proc in psutil.process_iter(["pid", "ppid"]):
            try:
                environ = proc.environ()
            except (psutil.Error, OSError):
                continue
            ident = rank_env(environ)
            if ident is None or ident.job != job:
                continue
            node = by_dir.get(_worker_metrics_dir(proc, environ) or "")
            if node is None and by_dir:
                continue  # another lab's (or nobody's) job of that name
            found.append(Worker(proc.pid, proc.info["ppid"], ident.rank, node, dict(environ)))
        return sorted(found, key=lambda w: (w.rank, w.pid))

    def ranks(self, job: str) -> dict[int, str]:
        """Global rank -> node of the job's live workers on a known node.

        Raises:
            BackendError: the job has no live worker.
        """
        return {w.rank: w.node for w in self._require(job) if w.node is not None}

    def _require(self, job: str) -> list[Worker]:
        workers = self.workers(job)
        if not workers:
            raise BackendError(f"no live worker of job {job!r} found")
        return workers

    def _stop(self, first: list[int], what: str) -> tuple[list[int], str]:
        """SIGTERM the processes ``first``, SIGKILL them and their descendants still running
        after the grace period, until all are gone; (pids signalled, what was done).

        Raises:
            NotStopped: one is still running after SIGKILL (nothing is started in its place).
        """
        term: list[psutil.Process] = []
        every: dict[int, psutil.Process] = {}
        for pid in first:
            if pid <= 1 or pid == os.getpid():  # never init, never ourselves
                log.warning("refusing to signal pid %d", pid)
                continue
            try:
                proc = psutil.Process(pid)
                children = proc.children(recursive=True)
            except psutil.NoSuchProcess:
                log.info("process %d exited before the signal", pid)
                continue
            term.append(proc)
            every.update({p.pid: p for p in [proc, *children]})
        stopped = stop_processes(every.values(), grace_s=self.grace_period_s, term=term)
        require_gone(stopped, what)
        return [p.pid for p in term], stopped.describe()

    def restart_workers(self, job: str) -> str:
        """SIGTERM every worker of ``job``, SIGKILL after the grace period, until all are
        gone (torchrun restarts the group).

        Raises:
            BackendError: the job has no live worker; NotStopped: one survived SIGKILL.
        """
        workers = [w.pid for w in self._require(job)]
        pids, done = self._stop(workers, f"the workers of job {job}")
        return f"sent SIGTERM to {len(pids)} workers of job {job} (pids {pids}); {done}"

    def exclude_node_and_restart(self, job: str, node: str) -> str:
        """SIGTERM the torchrun agents of ``job`` on ``node``, SIGKILL them and their workers
        after the grace period, until all are gone.

        Raises:
            BackendError: no live worker on ``node``; NotStopped: one survived SIGKILL.
        """
        workers = [w for w in self._require(job) if w.node == node]
        if not workers:
            raise BackendError(f"job {job!r} has no live worker on node {node!r}")
        pids = {w.pid for w in workers}
        tops = [w for w in workers if w.ppid not in pids]  # a rank's own workers go with it
        agents = sorted({w.ppid for w in tops if w.ppid > 1})
        # A worker whose torchrun died was adopted by init: it is stopped itself.
        orphans = sorted(w.pid for w in tops if w.ppid <= 1)
        sent, done = self._stop(agents + orphans, f"the torchrun agents of job {job} on {node}")
        said = f"sent SIGTERM to the torchrun agents {[p for p in sent if p in agents]}"
        if orphans:
            said += f" and to the workers {orphans} that outlived theirs"
        return f"{said} of job {job} on {node}; {done}"

    def request_checkpoint(self, job: str) -> str:
        """Arm ``checkpoint_now`` in the control file of the job's lowest rank."""
        worker = next((w for w in self._require(job) if w.control_dir is not None), None)
        if worker is None or worker.control_dir is None:
            raise BackendError(f"no worker of job {job!r} has a control directory")
        path = worker.control_dir / f"rank{worker.rank}.json"
        arm_checkpoint(path, self.clock())
        return f"requested a checkpoint of job {job} in {path}"

    def collect_diagnostics(self, job: str, incident_id: int) -> str:
        """Write the job's workers' state and stacks to ``incident-<id>.json``."""
        py_spy = shutil.which("py-spy")
        report = []
        for worker in self._require(job):
            entry: dict[str, Any] = {"pid": worker.pid, "rank": worker.rank, "node": worker.node}
            try:
                proc = psutil.Process(worker.pid)
                entry["status"] = proc.status()
                entry["cmdline"] = proc.cmdline()
            except psutil.Error as exc:
                entry["error"] = str(exc)
            for name in ("wchan", "stack"):
                try:
                    entry[name] = Path(f"/proc/{worker.pid}/{name}").read_text()
                except OSError as exc:
                    entry[name] = f"unavailable: {exc.strerror or exc}"
            if py_spy:
                try:
                    done = subprocess.run(
                        [py_spy, "dump", "--pid", str(worker.pid)],
                        capture_output=True,
                        text=True,
                        timeout=PY_SPY_TIMEOUT_S,
                        check=False,
                    )
                    entry["py_spy"] = done.stdout + done.stderr
                except subprocess.TimeoutExpired:
                    entry["py_spy"] = f"timed out after {PY_SPY_TIMEOUT_S:g} s"
            report.append(entry)
        return report_diagnostics(
            self.diagnostics_dir,
            incident_id,
            job=job,
            platform="lab",
            now=self.clock(),
            kind="workers",
            entries=report,
        )


__all__ = [
    "LAB_TARGET_FILE",
    "LabBackend",
    "Worker",
    "lab_placement",
    "lab_target_path",
    "read_lab_target",
]
