"""Shared helpers of the fault kinds on a node: commands, process identity, names from ids.

Every helper raises :class:`~stormwatch.faults.errors.FaultError` (never a bare
``CalledProcessError``) with the command and its stderr, so the agent's fault API
answers with a message an operator can act on.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil

from stormwatch.faults.errors import FaultError, FaultTargetNotFound
from stormwatch.faults.node import FaultContext, RankSeen

#: Seconds any one system command may take (iptables waits for its lock with ``-w``).
COMMAND_TIMEOUT_S = 20.0


def run(args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command; a missing tool, a timeout or (with ``check``) a non-zero exit raise.

    Raises:
        FaultError: naming the command and its stderr.
    """
    if shutil.which(args[0]) is None:
        raise FaultError(f"{args[0]} is not installed on this node (needed for this fault)")
    try:
        done = subprocess.run(
            list(args), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FaultError(f"{' '.join(args)}: {exc}") from exc
    if check and done.returncode != 0:
        raise FaultError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def short_tag(fault_id: str, length: int = 12) -> str:
    """A stable short hex tag of ``fault_id`` (chain, cgroup and folder names have length limits)."""
    return hashlib.sha256(fault_id.encode()).hexdigest()[:length]


def process_ref(process: psutil.Process) -> list[float]:
    """``[pid, create_time]``: identifies a process across pid reuse (stored in the ledger)."""
    return [process.pid, process.create_time()]


def same_process(ref: Sequence[float]) -> psutil.Process | None:
    """The live process ``ref`` names, or None (gone, zombie, or the pid was reused)."""
    try:
        process = psutil.Process(int(ref[0]))
        if abs(process.create_time() - float(ref[1])) >= 0.01:
            return None
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process
    except (psutil.Error, ValueError, IndexError):
        return None


def job_ranks(ctx: FaultContext, job: str | None) -> list[RankSeen]:
    """This node's running ranks (of ``job``), after a fresh scan.

    Raises:
        FaultTargetNotFound: none.
    """
    ctx.ranks.scan()
    found = [r for r in ctx.ranks.ranks() if r.alive and (job is None or r.job == job)]
    if not found:
        where = f" of job {job}" if job else ""
        raise FaultTargetNotFound(f"no rank{where} is running on node {ctx.node}")
    return found


def job_orphans(ctx: FaultContext, job: str | None) -> list[psutil.Process]:
    """This node's rank processes (of ``job``) that outlived their launcher, as of the last
    scan, that still run (pid and start time)."""
    found = []
    for orphan in ctx.ranks.orphaned.orphans():
        process = same_process([orphan.pid, orphan.create_time])
        if process is not None and (job is None or orphan.job == job):
            found.append(process)
    return found


def rank_process(ctx: FaultContext, rank: int, job: str | None) -> psutil.Process:
    """The process of ``rank`` (of ``job``) on this node, after a fresh scan.

    Raises:
        FaultTargetNotFound: the rank is not running here.
        FaultError: it runs in several jobs (give ``job``), or it exited meanwhile.
    """
    ranks = [r for r in job_ranks(ctx, job) if r.rank == rank]
    if not ranks:
        raise FaultTargetNotFound(f"rank {rank} is not running on node {ctx.node}")
    if len(ranks) > 1:
        raise FaultError(f"rank {rank} runs in several jobs on node {ctx.node}; give 'job'")
    try:
        return psutil.Process(ranks[0].pid)
    except psutil.Error as exc:
        raise FaultError(f"rank {rank} (pid {ranks[0].pid}): {exc}") from exc


def torchrun_of(ctx: FaultContext, pid: int) -> psutil.Process | None:
    """The torchrun agent ``pid`` descends from (nearest ancestor), or None."""
    try:
        for parent in psutil.Process(pid).parents():
            try:
                if ctx.is_launcher(parent.name(), parent.cmdline()):
                    return parent
            except psutil.Error:
                continue
    except psutil.Error:
        return None
    return None


def torchruns(ctx: FaultContext, ranks: Iterable[RankSeen]) -> list[psutil.Process]:
    """The distinct torchrun agents of ``ranks``."""
    found: dict[int, psutil.Process] = {}
    for info in ranks:
        agent = torchrun_of(ctx, info.pid)
        if agent is not None:
            found[agent.pid] = agent
    return [found[pid] for pid in sorted(found)]


def option_value(cmdline: Sequence[str], *names: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in a command line (first of ``names`` found)."""
    for i, arg in enumerate(cmdline):
        for name in names:
            if arg == name and i + 1 < len(cmdline):
                return cmdline[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1 :]
    return None


def store_endpoint(cmdline: Sequence[str]) -> tuple[str, int] | None:
    """The rendezvous store a torchrun command line names, as ``(host, port)``:
    ``--rdzv-endpoint HOST:PORT`` (or ``--rdzv_endpoint``; an IPv6 host in brackets loses
    them), else ``--master-addr``/``--master-port`` (static rendezvous). None when it names
    none, or a port that is not an integer in 1..65535 (torchrun's own default then
    applies, which this cannot know). Loopback hosts are returned as they are."""
    rdzv = option_value(cmdline, "--rdzv-endpoint", "--rdzv_endpoint")
    if rdzv:
        host, _, port = rdzv.rpartition(":")
    else:
        host = option_value(cmdline, "--master-addr", "--master_addr") or ""
        port = option_value(cmdline, "--master-port", "--master_port") or ""
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def rank_option(ctx: FaultContext, job: str | None, *names: str) -> Path | None:
    """An option of the trainer (after ``train`` on a rank's command line), resolved."""
    for info in job_ranks(ctx, job):
        try:
            process = psutil.Process(info.pid)
            cmdline, cwd = process.cmdline(), process.cwd()
        except psutil.Error:
            continue
        tail = cmdline[cmdline.index("train") + 1 :] if "train" in cmdline else cmdline
        value = option_value(tail, *names)
        if value is not None:
            return (Path(cwd) / value).resolve()
    return None


SIGNAL_SETTLE_S = 2.0
"""How long a SIGSTOP or SIGCONT may take to show in the process's state (s). Signals are
asynchronous: the state changes when the target is next scheduled, which on a loaded node
takes milliseconds, not seconds."""


def _is_stopped(process: psutil.Process, *, traced: bool = False) -> bool | None:
    """Whether ``process`` is stopped (state ``T``; with ``traced``, ``t`` too: a debugger
    such as the agent's ``py-spy dump`` holds it, and the SIGSTOP lands when it lets go);
    None when it is gone or a zombie."""
    try:
        status = process.status()
    except psutil.Error:
        return None
    if status == psutil.STATUS_ZOMBIE:
        return None
    return status == psutil.STATUS_STOPPED or (traced and status == psutil.STATUS_TRACING_STOP)


def wait_stopped(
    processes: Sequence[psutil.Process], timeout: float = SIGNAL_SETTLE_S
) -> list[int]:
    """Wait until every one of ``processes`` shows stopped after a SIGSTOP.

    Returns:
        The pids still not stopped after ``timeout`` seconds (empty: all stopped). A process
        that is gone (or a zombie) counts as done: there is nothing left to stop. One held
        by a debugger counts as stopped.
    """

    def running() -> list[int]:
        return [p.pid for p in processes if _is_stopped(p, traced=True) is False]

    wait_until(lambda: not running(), timeout)
    return running()


def wait_continued(
    processes: Sequence[psutil.Process], timeout: float = SIGNAL_SETTLE_S
) -> list[int]:
    """Wait until none of ``processes`` shows stopped after a SIGCONT.

    Returns:
        The pids still stopped after ``timeout`` seconds (empty: all continued). A process
        that is gone (or a zombie) counts as continued, and so does one a debugger holds
        for a moment (its own stop, not the fault's).
    """

    def stopped() -> list[int]:
        return [p.pid for p in processes if _is_stopped(p)]

    wait_until(lambda: not stopped(), timeout)
    return stopped()


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``predicate()`` until true or ``timeout`` seconds pass (at least once); returns
    whether it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


__all__ = [
    "COMMAND_TIMEOUT_S",
    "SIGNAL_SETTLE_S",
    "job_orphans",
    "job_ranks",
    "option_value",
    "process_ref",
    "rank_option",
    "rank_process",
    "run",
    "same_process",
    "short_tag",
    "torchrun_of",
    "torchruns",
    "wait_continued",
    "wait_stopped",
    "wait_until",
]
