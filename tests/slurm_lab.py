"""One Slurm lab shared by the end-to-end modules that need the same shape (three nodes,
jobs on two, node2 the spare, one rank per node; ``scheduler: slurm``): the ``slurm_lab``
fixture.

One rank per node (``nproc_per_node=1``): a job is ranks 0 (node0) and 1 (node1), world
size 2. None of its users' subjects is several ranks on one node (a rank or node lost, a
job moved, a hang named, a command run through the recipe), and every rank process costs
3-9 CPU-s of imports and set-up before its first step, so a job of 2 ranks instead of 4
halves what its starts and restarts cost. The one test whose subject needs two ranks on a
node (the node agent names a hung rank from the dumps of the ranks on its own node, which
needs a peer there that answers: FC-10's zero-code case in
tests/telemetry/integrations/test_lightning_lab.py) brings up a lab of its own,
``slurm_lab_two_ranks_per_node`` (two nodes of two ranks; it never runs beside the shared
one: the collection hook puts every user of ``slurm_lab`` together).

Bringing a lab up and down costs 15-30 s each on the 2-core test machine, and the modules
that use this one (tests/chaos/test_slurm_lab_scenarios.py, tests/lab/test_lab_slurm_jobs.py,
tests/lab/test_slurm_lab_responder.py, tests/telemetry/integrations/test_lightning_lab.py)
each brought up their own. Here:

* the first test that uses ``slurm_lab`` brings it up; the collection hook puts every
  user next to each other (at the place of the first), and the teardown hook brings the
  lab down right after the last one, so it never idles beside other tests;
* after each user the lab must be as that test found it: no Slurm job left running or
  pending, every node in service (a test that leaves one fails at teardown, and what it
  left is cleaned up so that the next test starts from a clean lab);
* its responder's runbook policy is the lab's own (lab/services/responder-policy.yml)
  plus ``StormwatchStraggler -> exclude_node_restart`` (the responder module's case).

Registered as a plugin by ``tests/conftest.py`` (the tests run in importlib mode, where
``tests/`` is not importable).
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stormwatch.lab import Lab, LabConfig
from stormwatch.lab.netns import IpRoute2
from stormwatch.lab.paths import RunPaths
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.slurm import SlurmCommands
from stormwatch.platforms.slurm_readback import in_service

FIXTURE = "slurm_lab"

#: The shared lab's runbook policy: the lab's own, plus the straggler's node exclusion.
POLICY = """\
dry_run: false
guards:
  restart_budget: {max_actions: 3, window: 1h}
rules:
  - alertname: StormwatchRankStalled
    actions: [confirm_restart]
  - alertname: StormwatchTrainingHung
    actions: [restart_workers]
  - alertname: StormwatchStraggler
    actions: [exclude_node_restart]
"""

#: Slurm job states of a job that still holds (or waits for) nodes.
_ACTIVE = frozenset({"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"})
#: Seconds a test's last job may take to leave Slurm (a cancel waits KillWait, 5 s).
_SETTLE_S = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(*, nodes: int, nproc_per_node: int) -> LabConfig:
    ports: set[int] = set()
    while len(ports) < 4:
        ports.add(_free_port())
    prometheus, alertmanager, responder, slurmctld = sorted(ports)
    used = [iface.network for _, iface in IpRoute2().addresses()]
    subnet = next(
        net
        for net in (
            ipaddress.IPv4Network(f"10.222.{i}.0/24") for i in random.sample(range(256), 256)
        )
        if not any(net.overlaps(u) for u in used)
    )
    return LabConfig(
        nodes=nodes,
        nproc_per_node=nproc_per_node,
        prefix=f"swsl{random.randrange(16**2):02x}",
        subnet=subnet,
        prometheus_port=prometheus,
        alertmanager_port=alertmanager,
        responder_port=responder,
        slurmctld_port=slurmctld,
        rdzv_port=29710,
        scheduler="slurm",
    )


class SharedSlurmLab:
    """The lab, up from its first user's set-up to :meth:`close`: ``nodes`` nodes (jobs on
    the first two) of ``nproc_per_node`` ranks each."""

    def __init__(self, *, nodes: int = 3, nproc_per_node: int = 1) -> None:
        self._shape = {"nodes": nodes, "nproc_per_node": nproc_per_node}
        self._lab: Lab | None = None
        self._config: LabConfig | None = None
        self._run_dir: Path | None = None
        #: Seconds ``lab up`` took (printed in its users' figures).
        self.up_seconds = 0.0

    def get(self) -> Lab:
        if self._lab is not None:
            return self._lab
        if os.geteuid() != 0:
            pytest.skip("needs root: the lab creates network namespaces and runs Slurm's daemons")
        config = _config(**self._shape)
        run_dir = Path(tempfile.mkdtemp(prefix=f"{config.prefix}-run-"))
        run_dir.chmod(0o755)  # munged runs as the munge user; jobs read the run folder
        policy = RunPaths.of(run_dir).responder_dir / "policy.yml"
        policy.parent.mkdir(parents=True)
        policy.write_text(POLICY, encoding="utf-8")
        self._config, self._run_dir = config, run_dir
        lab = Lab(run_dir)
        started = time.monotonic()
        try:
            lab.up(config)
        except BaseException:
            self.close()
            raise
        self.up_seconds = time.monotonic() - started
        print(f"\nFIGURES slurm lab {self._shape} up: {self.up_seconds:.0f} s")
        self._lab = lab
        return lab

    def close(self) -> None:
        """Bring the lab down (nothing when it is not up); safe to call twice."""
        config, run_dir = self._config, self._run_dir
        self._lab = self._config = self._run_dir = None
        if config is None or run_dir is None:
            return
        started = time.monotonic()
        try:
            Lab(run_dir).down(config)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        print(f"\nFIGURES slurm lab {self._shape} down: {time.monotonic() - started:.0f} s")


_KEY = pytest.StashKey[SharedSlurmLab]()


def _uses(item: pytest.Item | None) -> bool:
    return item is not None and FIXTURE in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every user of the shared lab next to each other, where the first one was."""
    users = [item for item in items if _uses(item)]
    if not users:
        return
    first = items.index(users[0])
    others = [item for item in items if not _uses(item)]
    items[:] = others[:first] + users + others[first:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last user's own teardown: the lab goes down."""
    try:
        return (yield)
    finally:
        shared = item.config.stash.get(_KEY, None)
        if shared is not None and _uses(item) and not _uses(nextitem):
            shared.close()


@pytest.fixture(scope="session")
def _shared_slurm_lab(pytestconfig: pytest.Config) -> Iterator[SharedSlurmLab]:
    shared = pytestconfig.stash.setdefault(_KEY, SharedSlurmLab())
    try:
        yield shared
    finally:  # a session that stops among the users (-x, ^C) brings it down here
        shared.close()


def _left_behind(slurm: SlurmCommands) -> list[str]:
    try:
        jobs = [j for j in slurm.jobs() if j.state in _ACTIVE]
        nodes = [n for n in slurm.nodes().values() if not in_service(n)]
    except BackendError as exc:
        return [f"Slurm did not answer: {exc}"]
    return [f"job {j.job_id} ({j.name}) {j.state}" for j in jobs] + [
        f"node {n.name} {n.state} ({n.reason_text})" for n in nodes
    ]


@pytest.fixture
def slurm_lab(_shared_slurm_lab: SharedSlurmLab) -> Iterator[Lab]:
    """The shared Slurm lab (three nodes, node2 the spare, one rank per node); a test must
    leave it with no Slurm job running or pending and every node in service."""
    lab = _shared_slurm_lab.get()
    yield lab
    _check_left_as_found(lab)


@pytest.fixture
def slurm_lab_two_ranks_per_node() -> Iterator[Lab]:
    """A Slurm lab of its own for one test: two nodes of two ranks each (a job is ranks 0-1
    on node0 and 2-3 on node1), for a subject that needs two ranks on one node; brought up
    and down around the test, with the shared lab's policy and end-of-test check."""
    own = SharedSlurmLab(nodes=2, nproc_per_node=2)
    try:
        lab = own.get()
        yield lab
        _check_left_as_found(lab)
    finally:
        own.close()


def _check_left_as_found(lab: Lab) -> None:
    """Fail (after cleaning up) when a Slurm job is left running or pending or a node out
    of service."""
    assert lab.state.slurm is not None
    slurm = SlurmCommands(conf=lab.state.slurm.conf)
    deadline = time.monotonic() + _SETTLE_S
    while (left := _left_behind(slurm)) and time.monotonic() < deadline:
        time.sleep(1.0)
    if not left:
        return
    active = {j.name for j in slurm.jobs() if j.state in _ACTIVE}
    for name in sorted(active & set(lab.state.jobs)):  # clean up for the next test, then fail
        lab.stop_job(name, grace=0)
    for node in slurm.nodes().values():
        if not in_service(node):
            slurm.update_node(node.name, "RESUME")
    pytest.fail(f"the test left the shared Slurm lab changed: {left}")
