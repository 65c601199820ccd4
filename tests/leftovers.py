"""The suite leaves nothing behind (issue 21): a pytest plugin that fails a session whose
tests left a process, a network namespace, a mount or an iptables chain behind.

How a session tells its own leftovers from anybody else's (``make test`` runs two pytest
sessions at once, other users run jobs on the same machine):

* processes: at session start :data:`SESSION_ENV` is set to a fresh id in this process's
  environment, and around each test :data:`NODEID_ENV` to the test's node id; every process
  started from a test (a ``Popen`` with the inherited environment, and everything it starts,
  orphaned or not) carries both. At session end every process whose
  ``/proc/<pid>/environ`` has this session's id is a leftover, named by the test that
  started it; so is any live descendant of this process (one started with an environment
  of its own). Leftovers get a short grace to finish exiting
  (:data:`SETTLE_S`), are reported, then stopped (SIGTERM, SIGKILL:
  :func:`stormwatch.platforms.stopping.stop_processes`) so that the machine is clean.
* network namespaces (``/run/netns``), mount points (``/proc/self/mountinfo``) and iptables
  chains (``iptables-save``, root only) are listed before and after each test that may make
  them (marked ``e2e`` or ``root``). One that appeared during such a test of this session
  and is still there at its end is a leftover of that test. Kernel objects carry no mark of
  who made them: a session that runs beside another one making namespaces (``make test``'s
  background tier, beside the foreground's labs) turns this half off with
  ``--leftover-kernel-objects=no`` and leaves it to the session that makes them.

A leftover fails the session (exit status 1) and is listed in a ``leftovers`` section of
the terminal summary: what it is, and the test that started it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psutil
import pytest

#: Set in every process started from this session (its id).
SESSION_ENV = "STORMWATCH_TEST_SESSION"
#: Set around each test to its node id: names the test that started a leftover.
NODEID_ENV = "STORMWATCH_TEST_NODEID"
#: Seconds leftovers are given to finish exiting before they count (a process signalled by
#: the last fixture's teardown may still be on its way out).
SETTLE_S = 5.0
#: Seconds from SIGTERM to SIGKILL when the plugin stops the leftovers it reported.
STOP_GRACE_S = 2.0
_NETNS_DIR = "/run/netns"
#: The command lines of multiprocessing's helpers (a forkserver, the resource tracker) that a
#: test starts in this pytest process: they serve the process itself and end with it, so a
#: direct child of it running one is not a leftover. What the forkserver forks still is (it
#: carries the forkserver's command line and environment: named by the test that started it).
_OWN_HELPERS = (
    "from multiprocessing.forkserver import main",
    "from multiprocessing.resource_tracker import main",
)


def _netns() -> set[str]:
    try:
        return set(os.listdir(_NETNS_DIR))
    except OSError:  # no namespace made yet on this machine
        return set()


#: Mount points that are the machine's set-up, not anybody's leftover: iproute2 bind-mounts
#: ``/run/netns`` onto itself (shared propagation) the first time any namespace is added on
#: a machine, and keeps it for good (``ip-netns(8)``). On a fresh machine (CI) whichever test
#: adds the first namespace would otherwise be blamed for it. The namespaces under it
#: (``/run/netns/<name>``, each a mount of its own) are still judged.
MACHINE_MOUNTS = frozenset({_NETNS_DIR, "/var/run/netns"})


def mount_points(mountinfo: str) -> set[str]:
    """The mount points (field 5 of ``proc(5)``'s ``mountinfo``) of ``mountinfo``'s lines,
    less :data:`MACHINE_MOUNTS`."""
    points = {line.split()[4] for line in mountinfo.splitlines() if len(line.split()) > 4}
    return points - MACHINE_MOUNTS


def _mounts() -> set[str]:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            return mount_points(handle.read())
    except OSError:
        return set()


def _chains() -> set[str]:
    """``table:chain`` of every iptables chain; empty when iptables cannot be read (not root)."""
    if os.geteuid() != 0 or shutil.which("iptables-save") is None:
        return set()
    try:
        out = subprocess.run(
            ["iptables-save"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    chains, table = set(), ""
    for line in out.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            chains.add(f"{table}:{line[1:].split()[0]}")
    return chains


#: What is listed around a test that may make kernel objects: kind -> lister.
_KERNEL_OBJECTS: dict[str, Callable[[], set[str]]] = {
    "network namespace": _netns,
    "mount": _mounts,
    "iptables chain": _chains,
}


@dataclass
class Leftovers:
    """The plugin (registered by ``tests/conftest.py``)."""

    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: Whether kernel objects are judged (``--leftover-kernel-objects``).
    kernel_objects: bool = True
    #: kind -> name -> node id of the test during which it appeared.
    appeared: dict[str, dict[str, str]] = field(default_factory=dict)
    found: list[str] = field(default_factory=list)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        os.environ[SESSION_ENV] = self.session_id
        option = session.config.getoption("--leftover-kernel-objects", default="yes")
        self.kernel_objects = option != "no"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        may_make = item.get_closest_marker("e2e") or item.get_closest_marker("root")
        every_test = _KERNEL_OBJECTS if may_make and self.kernel_objects else {}
        before = {kind: lister() for kind, lister in every_test.items()}
        previous = os.environ.get(NODEID_ENV)
        os.environ[NODEID_ENV] = item.nodeid
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(NODEID_ENV, None)
            else:
                os.environ[NODEID_ENV] = previous
            for kind, lister in every_test.items():
                for name in lister() - before[kind]:
                    self.appeared.setdefault(kind, {})[name] = item.nodeid

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.found = self._processes() + self._kernel_objects()
        if self.found and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.found:
            return
        terminalreporter.section("leftovers", sep="=", red=True, bold=True)
        terminalreporter.line(
            f"{len(self.found)} thing(s) started by this run outlived it (processes were "
            "stopped after this report):"
        )
        for line in self.found:
            terminalreporter.line(f"  {line}")

    # ------------------------------------------------------------------ finding
    def _processes(self) -> list[str]:
        deadline = time.monotonic() + SETTLE_S
        while (left := self._our_processes()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not left:
            return []
        lines = [f"process {_describe(proc)} started by {test}" for proc, test in left]
        from stormwatch.platforms.stopping import stop_processes

        with contextlib.suppress(Exception):  # reporting matters more than the clean-up
            stop_processes([proc for proc, _ in left], grace_s=STOP_GRACE_S)
        return lines

    def _our_processes(self) -> list[tuple[psutil.Process, str]]:
        own = psutil.Process()
        spare = {own.pid, *(p.pid for p in own.parents())}
        children = {p.pid for p in own.children(recursive=True)}
        found = []
        for proc in psutil.process_iter():
            if proc.pid in spare:
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue  # exited: holds nothing
                if proc.ppid() == own.pid and any(
                    helper in " ".join(proc.cmdline()) for helper in _OWN_HELPERS
                ):
                    continue  # this process's multiprocessing helper: ends with it
                environ = proc.environ()
            except psutil.Error:
                environ = {}  # gone, or not readable: only a child of ours counts
            if environ.get(SESSION_ENV) == self.session_id:
                found.append((proc, environ.get(NODEID_ENV, "the session's set-up")))
            elif proc.pid in children:
                found.append((proc, "an unknown test (its environment has no test id)"))
        return found

    def _kernel_objects(self) -> list[str]:
        lines = []
        for kind, lister in _KERNEL_OBJECTS.items():
            appeared = self.appeared.get(kind, {})
            if not appeared:
                continue
            for name in sorted(lister() & appeared.keys()):
                lines.append(f"{kind} {name} made during {appeared[name]}")
        return lines


def _describe(proc: psutil.Process) -> str:
    try:
        cmdline = " ".join(" ".join(proc.cmdline()).split())[:120]  # one line
    except psutil.Error:
        cmdline = "?"
    return f"pid {proc.pid} ({cmdline})"


__all__ = ["NODEID_ENV", "SESSION_ENV", "Leftovers"]
