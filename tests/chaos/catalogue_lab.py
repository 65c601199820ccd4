"""Drive the chaos controller against one lab and observe what its faults do there.

Used by ``test_catalogue_on_lab.py``. :class:`LabChaos` injects a fault the way
the runner does (an experiment fault model from a dict, :class:`~stormwatch.chaos.execution.injection.injector.Injector`
with the lab's ledger, ``lab_target`` and an :class:`AgentClient`) and reverts
every open fault the way ``stormwatch chaos revert --all`` does (the CLI itself,
or :func:`~stormwatch.chaos.ledger.revert.revert_open`). The observers look at the lab,
not at the controller's answers: connections from inside a node's namespace,
the job's rank logs, process states, cgroups, the agents' ``/metrics``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families
from pydantic import TypeAdapter

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.execution.injection.injector import Injected, Injector
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.ledger.revert import revert_open
from stormwatch.chaos.target import Target, lab_target
from stormwatch.contracts.journal import JobRef
from stormwatch.faults import AnyExperimentFault
from stormwatch.lab import Lab
from stormwatch.lab.state import NodeState
from stormwatch.telemetry.ranklogs import read_job_logs

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))
NETPROBE = str(Path(__file__).with_name("netprobe.py"))
FAULT = TypeAdapter(AnyExperimentFault)
EXPERIMENT = "catalogue"
#: Agent-side states of a fault that is still in force.
IN_FORCE = ("injecting", "applied")
T = TypeVar("T")


def poll(get: Callable[[], T | None], timeout: float, what: str, every: float = 0.1) -> T:
    """``get()`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (found := get()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
    return found


def in_netns(netns: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` inside network namespace ``netns``."""
    return subprocess.run(
        ["ip", "netns", "exec", netns, *cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def netprobe(netns: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``tests/chaos/netprobe.py ARGS`` inside ``netns``."""
    return in_netns(netns, sys.executable, NETPROBE, *args)


def connects(node: NodeState, address: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a TCP connection from inside ``node`` to ``address:port`` opens."""
    return netprobe(node.netns, "connect", address, str(port), str(timeout)).returncode == 0


def link_up(netns: str) -> bool:
    """Whether ``eth0`` inside ``netns`` is up."""
    shown = in_netns(netns, "ip", "-o", "link", "show", "dev", "eth0").stdout
    return "state UP" in shown or ",UP" in shown.split(">")[0]


def answers(agent_url: str) -> bool:
    """Whether the agent answers ``GET /healthz`` with 200."""
    try:
        with urllib.request.urlopen(f"{agent_url}/healthz", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def write_as(pid: int, folder: Path) -> int:
    """Write (then remove) a file in ``folder`` as process ``pid`` sees it (its mount and
    network namespaces): 0, or the errno of the failure."""
    code = (
        "import errno, os, sys, time\n"
        "try:\n"
        f"    p = os.path.join({str(folder)!r}, f'probe-{{time.monotonic_ns()}}')\n"
        "    open(p, 'wb').write(b'x' * 10000); os.remove(p)\n"
        "except OSError as exc:\n"
        "    sys.exit(exc.errno)\n"
    )
    done = subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "-n", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode


def metrics(agent_url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The agent's ``/metrics``: (sample name, labels) -> value."""
    with urllib.request.urlopen(f"{agent_url}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    exposed = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    return {
        # prometheus-client's parser renames a counter's samples <name>_total even where the
        # agent exposes them under the family's own name (dcgm-exporter's counters: the
        # exposed DCGM_FI_DEV_XID_ERRORS became DCGM_FI_DEV_XID_ERRORS_total); keep the
        # exposed name, as Prometheus does.
        (s.name if s.name in exposed else family.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    scrape: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """Sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in scrape.items() if n == name and wanted <= got)


def status(pid: int) -> str:
    """psutil status of ``pid``; ``gone`` once it no longer exists (or is a zombie)."""
    try:
        state = str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"
    return "gone" if state == psutil.STATUS_ZOMBIE else state


@dataclass
class LabChaos:
    """The chaos controller's inject and revert paths, pointed at one lab and one job."""

    lab: Lab
    job: str
    _names: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def target(self) -> Target:
        return lab_target(self.lab.run_dir)

    @property
    def ledger(self) -> Ledger:
        return Ledger(ledger_path(self.lab.run_dir))

    @property
    def log_dir(self) -> Path:
        return Path(self.lab.job(self.job).log_dir)

    def node(self, name: str) -> NodeState:
        return next(n for n in self.lab.state.nodes if n.name == name)

    # ------------------------------------------------------------ controller
    def inject(self, fault: dict[str, Any]) -> Injected:
        """Validate ``fault`` as an experiment's ``fault:`` mapping and inject it."""
        spec = FAULT.validate_python(fault)
        name = f"{fault['kind']}-{next(self._names)}"

        async def go() -> Injected:
            async with aiohttp.ClientSession() as session:
                injector = Injector(
                    ledger=self.ledger,
                    agents=AgentClient(session),
                    target=self.target,
                    job=JobRef(
                        name=self.job, log_dir=self.log_dir, world_size=4, started_by_runner=False
                    ),
                    experiment_id=EXPERIMENT,
                    status=lambda _line: None,
                    step_poll_seconds=0.2,
                )
                return await injector.inject(name, spec, recorded=lambda: None)

        return asyncio.run(go())

    def revert_all(self, *, cli: bool = False) -> None:
        """Revert every open fault (``stormwatch chaos revert --all``, or the function it calls)
        and check that each is closed in the ledger and that no agent holds one in force."""
        if cli:
            done = subprocess.run(
                [STORMWATCH, "chaos", "revert", "--all", "--run-dir", str(self.lab.run_dir)],
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            assert done.returncode == 0, done.stdout + done.stderr
        else:
            outcomes = asyncio.run(revert_open(self.ledger, reason="chaos revert"))
            assert all(o.ok for o in outcomes), outcomes
        assert self.ledger.open_faults() == []
        assert self.agent_faults_in_force() == []

    def agent_faults_in_force(self) -> list[str]:
        """``node: id (kind, state)`` of every fault an agent lists as injecting or applied."""
        token = Path(self.lab.state.agent_token_file).read_text().strip()
        found = []
        for node in self.lab.state.nodes:
            request = urllib.request.Request(
                f"{node.agent_fault_url}/v1/faults", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(request, timeout=5) as reply:
                records = json.loads(reply.read())["faults"]
            found += [
                f"{node.name}: {r['id']} ({r['kind']}, {r['state']})"
                for r in records
                if r["state"] in IN_FORCE
            ]
        return found

    def agent_record(self, injected: Injected) -> dict[str, Any]:
        """The agent's own record of a single-agent fault (``details`` and all)."""
        [request] = injected.entry.target.requests
        token = Path(self.lab.state.agent_token_file).read_text().strip()
        url = f"{request.agent_url}/v1/faults/{request.body['id']}"
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5) as reply:
            return dict(json.loads(reply.read()))

    # ------------------------------------------------------------- the job
    def steps_after(self, moment: float) -> dict[int, int]:
        """Rank -> how many steps it logged after Unix time ``moment``."""
        return {
            rank: sum(1 for e in log.steps if e.time > moment)
            for rank, log in read_job_logs(self.log_dir).items()
        }

    def starts_after(self, moment: float) -> dict[int, int]:
        """Rank -> how many times it (re)started after Unix time ``moment``."""
        return {
            rank: sum(1 for e in log.starts if e.time > moment)
            for rank, log in read_job_logs(self.log_dir).items()
        }

    def last_step(self, rank: int) -> int:
        """The step ``rank`` logged last."""
        last = read_job_logs(self.log_dir)[rank].last_step
        assert last is not None and last.step is not None, f"rank {rank} logged no step"
        return last.step

    def step_gaps_after(self, moment: float, rank: int = 0) -> list[float]:
        """Seconds between ``rank``'s consecutive steps logged after ``moment``."""
        times = [e.time for e in read_job_logs(self.log_dir)[rank].steps if e.time > moment]
        return [b - a for a, b in itertools.pairwise(times)]

    def progressing(self, timeout: float = 60, steps: int = 2) -> None:
        """Every rank logs ``steps`` new steps (from now) within ``timeout`` s."""
        since = time.time()
        poll(
            lambda: (
                (done := self.steps_after(since)) and min(done.values()) >= steps and len(done) == 4
            ),
            timeout,
            f"all 4 ranks to log {steps} new steps",
            every=0.2,
        )

    def stalled(self, seconds: float = 1.5) -> bool:
        """No rank logs a step during ``seconds`` (after a short settle for in-flight steps)."""
        time.sleep(0.5)
        since = time.time()
        time.sleep(seconds)
        return sum(self.steps_after(since).values()) == 0

    def rank_pid(self, rank: int) -> int:
        """The live process of ``rank``, as the agents list it."""

        def find() -> int | None:
            for node in self.lab.state.nodes:
                try:
                    with urllib.request.urlopen(f"{node.agent_url}/v1/ranks", timeout=5) as r:
                        rows = json.loads(r.read())["ranks"]
                except (OSError, urllib.error.URLError):
                    continue
                for row in rows:
                    if row["job"] == self.job and row["rank"] == rank and row["alive"]:
                        return int(row["pid"])
            return None

        return poll(find, 30, f"an agent to list rank {rank} alive", every=0.2)

    def ready(self, timeout: float = 180) -> None:
        """Back when every rank makes progress and the agents' rank watchers list all four."""
        self.progressing(timeout=timeout)
        for rank in range(4):
            self.rank_pid(rank)

    def fresh_job(self, timeout: float = 180) -> None:
        """Stop the job, whatever is left of it, and start it again (resuming nothing: it never
        checkpoints); back when it is :meth:`ready`."""
        spec = self.lab.job(self.job).spec
        self.lab.stop_job(self.job, grace=2)
        self.lab.start_job(spec)
        self.ready(timeout)

    def torchrun_pid(self, rank: int) -> int:
        """The torchrun above ``rank``'s worker."""
        process = psutil.Process(self.rank_pid(rank))
        while process is not None and "torchrun" not in " ".join(process.cmdline()):
            process = process.parent()
        assert process is not None, f"no torchrun above rank {rank}"
        return process.pid


__all__ = [
    "IN_FORCE",
    "LabChaos",
    "answers",
    "connects",
    "in_netns",
    "link_up",
    "metrics",
    "netprobe",
    "poll",
    "status",
    "value",
    "write_as",
]
