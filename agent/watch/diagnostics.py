"""Hang diagnostics: what the agent records about a job's ranks when one hangs.

For each running rank of the job on this node, one text file
``<state-dir>/diagnostics/<job>/<UTC time>/rank<R>.txt`` holding:

* a header: job, rank, pid, the hung ranks, each rank's collective count and lag
  (``stormwatch_collective_calls_total`` summed over ``op``);
* the rank's Python stacks from ``py-spy dump --pid`` when ``py-spy`` is on
  ``PATH`` (it needs ptrace rights: root, or ``CAP_SYS_PTRACE``), otherwise the
  kernel stack ``/proc/<pid>/stack`` (root only) and ``/proc/<pid>/status``;
* the rank's newest post-mortem dump ``<dump-dir>/rank<R>.attempt<A>.pid<P>.json`` (or an
  older writer's ``rank<R>.json``) when one exists (written on
  abnormal exit, and when the agent asks a hung job's ranks for one:
  :mod:`.hangdumps`; the dump folder is ``--dump-dir`` after ``train`` on the rank's
  command line, else ``<--log-dir>/dumps``, else its ``STORMWATCH_DUMP_DIR``;
  docs/ARCHITECTURE.md "Trainer -> agent telemetry");
* the hang's culprit when the dumps name one (:func:`stormwatch.postmortem.culprit_from_dumps`).

Each section that cannot be read says why instead; nothing here raises.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stormwatch.agent.watch.procs import train_option
from stormwatch.contracts.rank_env import RankKey

if TYPE_CHECKING:  # imported when a hang is diagnosed (see .hangdumps)
    from stormwatch.postmortem import Culprit

log = logging.getLogger(__name__)

_IMPORT_LOCK = threading.Lock()


def load_dump_modules() -> None:
    """Import the trainer's dump modules and the post-mortem's culprit rules, one agent
    thread at a time; call before importing from them (they are imported at the first
    hang, not at start-up: ~5 MiB of the agent's memory).

    Two threads importing submodules of a package that is not imported yet deadlock on
    the import locks (the first holds ``stormwatch.telemetry`` and wants its ``dump``,
    the second holds ``dump`` and wants the package: CPython raises ``_DeadlockError``).
    The hang-diagnostics thread and the diagnostics writer did so at a hang (CI, cc13:
    the zero-code hang named no culprit).
    """
    with _IMPORT_LOCK:
        import stormwatch.postmortem
        import stormwatch.telemetry.culprit
        import stormwatch.telemetry.dump
        import stormwatch.telemetry.dump_requests  # noqa: F401


#: Seconds ``py-spy dump`` may take per rank.
PY_SPY_TIMEOUT = 20.0
#: Largest dump file copied into a diagnostics file, bytes.
MAX_DUMP_BYTES = 4 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class RankTarget:
    """A running rank to inspect: its key, pid, command line, working directory and
    environment."""

    key: RankKey
    pid: int
    cmdline: tuple[str, ...]
    cwd: str | None
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def dump_dir(self) -> Path | None:
        """Its dump folder (:func:`dump_dir`)."""
        return dump_dir(self.cmdline, self.cwd, self.environ)


def dump_dir(
    cmdline: Sequence[str], cwd: str | None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """A rank's dump folder: ``--dump-dir`` after ``train`` on its command line, else
    ``<--log-dir>/dumps``, else its ``STORMWATCH_DUMP_DIR`` (what
    :func:`stormwatch.telemetry.init` and ``stormwatch run`` use); None when it names none."""
    raw = train_option(cmdline, "--dump-dir")
    if raw is None:
        log_dir = train_option(cmdline, "--log-dir")
        if log_dir is not None:
            raw = str(Path(log_dir) / "dumps")
        else:
            raw = (environ or {}).get("STORMWATCH_DUMP_DIR") or None
    if raw is None:
        return None
    path = Path(raw)
    if not path.is_absolute() and cwd is not None:
        path = Path(cwd) / path
    return path


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def _stacks(pid: int) -> str:
    py_spy = shutil.which("py-spy")
    if py_spy is not None:
        try:
            done = subprocess.run(
                [py_spy, "dump", "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=PY_SPY_TIMEOUT,
                check=False,
            )
            return (
                f"## py-spy dump --pid {pid} (exit {done.returncode})\n{done.stdout}{done.stderr}"
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"## py-spy dump --pid {pid} failed: {exc}\n"
    parts = ["## py-spy not installed; kernel view instead\n"]
    for name in ("stack", "status"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_text(errors="replace")
        except OSError as exc:
            text = f"(unreadable: {exc.strerror})\n"
        parts.append(f"## /proc/{pid}/{name}\n{text}")
    return "".join(parts)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # replaced meanwhile
        return 0.0


def _dump(target: RankTarget) -> str:
    folder = target.dump_dir
    if folder is None:
        return "## trainer dump: the rank names no --dump-dir / --log-dir / STORMWATCH_DUMP_DIR\n"
    load_dump_modules()
    from stormwatch.telemetry.dump import dump_path, rank_dump_paths

    found = rank_dump_paths(folder, target.key[1])  # every attempt's: the newest is shown
    path = max(found, key=_mtime) if found else dump_path(folder, target.key[1])
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_DUMP_BYTES)
    except OSError as exc:
        return f"## trainer dump {path}: not available ({exc.strerror})\n"
    return f"## trainer dump {path}\n{data.decode(errors='replace')}\n"


def _culprit_lines(culprit: Culprit | None) -> str:
    if culprit is None:
        return "culprit: not named by the ranks' dumps\n"
    who = "no single rank" if culprit.rank is None else f"rank {culprit.rank}"
    sure = "certain" if culprit.certain else "uncertain"
    return f"culprit: {who} ({culprit.method}, {sure})\n" + "".join(
        f"  {line}\n" for line in culprit.evidence
    )


def folder_for(base: Path, job: str, now: float) -> Path:
    """``<base>/<job, file-safe>/<UTC time of now, YYYYmmddTHHMMSS.ffffffZ>``."""
    stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return base / _safe(job) / stamp


def collect(
    base: Path,
    job: str,
    targets: Sequence[RankTarget],
    *,
    hung: Sequence[int],
    calls: Mapping[RankKey, float],
    lag: Mapping[RankKey, float],
    now: float,
    culprit: Culprit | None = None,
) -> Path:
    """Write one diagnostics file per target; returns their folder.

    Args:
        base: ``<state-dir>/diagnostics``.
        job: the job (its name is made file-safe).
        targets: the job's running ranks on this node.
        hung: ranks of the job that are hung now.
        calls, lag: collective counts and lags of the job's ranks.
        now: Unix time naming the folder (UTC, ``YYYYmmddTHHMMSS.ffffffZ``).
        culprit: what the ranks' dumps say caused the hang (:mod:`.hangdumps`), if known.
    """
    folder = folder_for(base, job, now)
    stamp = folder.name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("cannot create %s: %s", folder, exc)
        return folder
    behind = max(lag.items(), key=lambda item: item[1], default=None)
    counts = ", ".join(
        f"rank {key[1]}: {calls[key]:g} (lag {lag.get(key, 0):g})" for key in sorted(calls)
    )
    for target in targets:
        header = (
            f"# stormwatch hang diagnostics\njob: {job}\nrank: {target.key[1]}\n"
            f"pid: {target.pid}\ntime: {stamp}\nhung ranks: {sorted(hung)}\n"
            f"collective calls: {counts or 'none recorded'}\n"
            f"behind in the collective sequence: "
            f"{'rank ' + str(behind[0][1]) if behind and behind[1] > 0 else 'no rank'}\n"
            f"{_culprit_lines(culprit)}\n"
        )
        text = header + _stacks(target.pid) + "\n" + _dump(target)
        path = folder / f"rank{target.key[1]}.txt"
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc)
    log.warning("hang diagnostics for job %s written to %s", job, folder)
    return folder


__all__ = ["MAX_DUMP_BYTES", "PY_SPY_TIMEOUT", "RankTarget", "collect", "dump_dir", "folder_for"]
