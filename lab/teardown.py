"""Taking a lab apart: stop its processes, delete its namespaces, veths and bridge.

Used by ``lab down``, by a failed or interrupted ``lab up`` (after its own
undo stack ran) and before ``lab up`` reuses a run directory. Everything here
is idempotent: a missing process or object is not an error.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil

from stormwatch.lab import registry
from stormwatch.lab.config import LabConfig
from stormwatch.lab.errors import LabError, SlurmError
from stormwatch.lab.jobs import launch
from stormwatch.lab.netns import NetworkLayer
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.progress import Progress, ProgressEvent
from stormwatch.lab.services import procs
from stormwatch.lab.slurm.lab_cluster import lab_cluster
from stormwatch.lab.state import LabState, NetResource, ProcessRecord, StateStore
from stormwatch.words import plural

log = logging.getLogger(__name__)


def live_owner(prefix: str, run_dir: Path) -> Path | None:
    """The run directory of *another* lab that is not down and claims ``prefix``, if any.

    A registry entry whose run directory has no ``lab.json``, or whose lab is down
    or uses another prefix now, is stale and ignored.
    """
    claim = registry.owner(prefix)
    if claim is None or claim.run_dir == run_dir:
        return None
    try:
        other = StateStore(RunPaths.of(claim.run_dir)).load()
    except LabError:
        other = None
    if other is None or other.phase == "down" or other.config.prefix != prefix:
        return None
    return claim.run_dir


def leftovers(network: NetworkLayer, config: LabConfig, run_dir: Path) -> list[str]:
    """What a sweep without ``lab.json`` would find of the lab in ``run_dir``: namespaces and
    links with ``config``'s names, processes with its marker, its Slurm cluster's remains."""
    found = [f"netns {n}" for n in network.namespaces() if config.owns_netns(n)]
    found += [f"link {n}" for n in network.links() if config.owns_link(n)]
    found += [f"process {p.pid}" for p in procs.processes_marked(run_dir)]
    if config.slurm:
        found += lab_cluster(run_dir, config).leftovers()
    return found


def other_labs(network: NetworkLayer, config: LabConfig, run_dir: Path) -> list[str]:
    """Run directories of other labs that use ``config``'s prefix: the registry's live
    owner, and the markers of lab processes inside namespaces with the prefix's names."""
    found: set[str] = set()
    owner = live_owner(config.prefix, run_dir)
    if owner is not None:
        found.add(str(owner))
    for name in network.namespaces():
        if config.owns_netns(name):
            found |= _foreign_markers(network, name, run_dir)
    return sorted(found)


def _foreign_markers(network: NetworkLayer, namespace: str, run_dir: Path) -> set[str]:
    """Run directories, other than ``run_dir``, of lab processes inside ``namespace``."""
    found = set()
    for proc in procs.namespace_processes(network.namespace_pids(namespace)):
        marker = procs.marker_of(proc)
        if marker is not None and marker != str(run_dir):
            found.add(marker)
    return found


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while cleaning up, so a second Ctrl-C cannot cut it short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def remove_resource(network: NetworkLayer, resource: NetResource, report: Progress) -> bool:
    """Delete one kernel object if it exists; whether it did."""
    if resource.kind == "netns":
        existed = resource.name in network.namespaces()
        network.delete_namespace(resource.name)
    else:
        existed = resource.name in network.links()
        network.delete_link(resource.name)
    if existed:
        report(ProgressEvent("remove", resource.name, f"removed {resource.kind} {resource.name}"))
    return existed


def stop_processes(records: list[ProcessRecord], report: Progress) -> None:
    """Stop ``records`` together (one grace period for all, not one each)."""
    victims = [proc for record in records for proc in procs.tree(record)]
    if victims:
        report(ProgressEvent("remove", "processes", f"stopping {len(records)} services"))
        procs.terminate(victims)


def teardown(
    store: StateStore, network: NetworkLayer, config: LabConfig, report: Progress
) -> list[str]:
    """Stop every process of the lab and remove its kernel objects (the caller holds the lock).

    Finds processes from ``lab.json`` (pid + start time), inside the lab's
    namespaces, and by the environment marker; kernel objects from ``lab.json``
    and by ``config``'s names. Stops all processes together (one grace period),
    then deletes namespaces, veths, and the bridge last.

    Returns:
        What was removed, one line each.

    Raises:
        LabError: something survived (after everything else was tried).
    """
    state = store.load()
    if state is not None:
        state.phase = "stopping"
        store.save(state)
    # 1. Processes: recorded ones (jobs first, they talk to the agents), then sweeps.
    interrupted_jobs = (
        [n for n, job in state.jobs.items() if launch.is_running(job)] if state is not None else []
    )
    # The Slurm cluster first: its jobs, step daemons and daemons in its order, its
    # spools and munge folder; found by its slurm.conf, so also after a crash.
    removed, problems = stop_slurm(store.run_dir, config, report)
    alive = _recorded_trees(state)
    namespaces, foreign = _our_namespaces(network, config, store.run_dir, state)
    more, failed = _stop_everything(alive, namespaces, network, store.run_dir, report)
    removed += more
    problems += failed
    # 2. Kernel objects: recorded ones in reverse, then anything with our names.
    gone, failed = _remove_kernel_objects(state, network, config, namespaces, foreign, report)
    removed += gone
    problems += failed
    if state is not None:
        state.phase = "down"
        state.resources.clear()
        state.processes.clear()
        state.slurm = None
        for name in interrupted_jobs:
            state.jobs[name].stopped = True
        store.save(state)
    if problems:
        raise LabError("lab down left things behind: " + "; ".join(problems))
    registry.release(config.prefix, store.run_dir)
    return removed


def stop_slurm(run_dir: Path, config: LabConfig, report: Progress) -> tuple[list[str], list[str]]:
    """Stop the lab's Slurm cluster and delete its runtime files when ``config`` has one
    (whatever is left of it, even without a pid file); (removed, problems)."""
    if not config.slurm:
        return [], []
    cluster = lab_cluster(run_dir, config)
    processes, files = cluster.remains()
    if not processes and not files:
        return [], []
    left = (
        f"{plural(len(processes), 'process', 'processes')}; "
        f"{plural(len(files), 'runtime file')} to delete"
    )
    report(ProgressEvent("remove", "slurm", f"stopping the Slurm cluster ({left})"))
    try:
        cluster.stop()
    except SlurmError as exc:
        return [], [str(exc)]
    return ["the Slurm cluster"], []


#: The first word of a :func:`teardown` line (``process agent-node0``, ``netns sw-node0``)
#: -> what :func:`removed_summary` counts it as, singular and plural.
_REMOVED_KINDS = {
    "process": ("process", "processes"),
    "netns": ("network namespace", "network namespaces"),
    "veth": ("veth", "veths"),
    "bridge": ("bridge", "bridges"),
}


def removed_summary(removed: list[str]) -> str:
    """One line for :func:`teardown`'s lines, counted by kind in the order they came:
    ``removed the Slurm cluster, 6 processes, 3 network namespaces and 1 bridge``; a line of
    no kind there (``the Slurm cluster``, ``2 unrecorded processes``) is shown as it is."""
    if not removed:
        return "nothing was left to remove"
    counts: dict[str, int] = {}
    for line in removed:
        kind = line.split(" ", 1)[0]
        key = kind if kind in _REMOVED_KINDS else line
        counts[key] = counts.get(key, 0) + 1
    parts = []
    for key, n in counts.items():
        if key not in _REMOVED_KINDS:
            parts.append(key)
            continue
        parts.append(plural(n, *_REMOVED_KINDS[key]))
    listed = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    return f"removed {listed}"


def _recorded_trees(state: LabState | None) -> dict[str, list[psutil.Process]]:
    """Process name -> its live process tree, for every process ``lab.json`` records."""
    records: list[ProcessRecord] = []
    if state is not None:
        records += [p for job in state.jobs.values() for p in job.processes.values()]
        records += list(state.processes.values())
    return {record.name: procs.tree(record) for record in records}


def _our_namespaces(
    network: NetworkLayer, config: LabConfig, run_dir: Path, state: LabState | None
) -> tuple[set[str], set[str]]:
    """The namespaces to empty and remove (recorded, plus those named by ``config``'s prefix),
    and the run directories of other labs seen (non-empty: no sweep by name at all).

    The name sweep must never reach another lab's objects: it is skipped when another
    run directory claims the prefix, and spares namespaces that its processes use.
    """
    recorded = {r.name for r in state.resources if r.kind == "netns"} if state else set()
    other = live_owner(config.prefix, run_dir)
    if other is not None:
        return set(recorded), {str(other)}
    foreign: set[str] = set()
    namespaces = set(recorded)
    for name in network.namespaces():
        if not config.owns_netns(name) or name in recorded:
            continue
        markers = _foreign_markers(network, name, run_dir)
        if markers:
            foreign |= markers
            log.warning("not touching namespace %s: used by the lab in %s", name, markers)
        else:
            namespaces.add(name)
    return namespaces, foreign


def _stop_everything(
    alive: dict[str, list[psutil.Process]],
    namespaces: set[str],
    network: NetworkLayer,
    run_dir: Path,
    report: Progress,
) -> tuple[list[str], list[str]]:
    """Stop the recorded trees, every unmarked or own process in ``namespaces`` and every
    process carrying this lab's marker, together (one grace period); (removed, problems)."""
    victims = {proc.pid: proc for tree in alive.values() for proc in tree}
    for name in namespaces:
        for proc in procs.namespace_processes(network.namespace_pids(name)):
            marker = procs.marker_of(proc)
            if marker is None or marker == str(run_dir):
                victims.setdefault(proc.pid, proc)
    for proc in procs.processes_marked(run_dir):
        victims.setdefault(proc.pid, proc)
    removed: list[str] = []
    problems: list[str] = []
    if victims:
        report(ProgressEvent("remove", "processes", f"stopping {len(victims)} processes"))
        survivors = procs.terminate(victims.values())
        survivors += _stop_late_children(run_dir, report)
        problems += [f"{s} survived SIGKILL" for s in survivors]
        removed += [f"process {name}" for name, tree in alive.items() if tree]
        unrecorded = len(victims) - sum(len(tree) for tree in alive.values())
        if unrecorded > 0:
            removed.append(plural(unrecorded, "unrecorded process", "unrecorded processes"))
    return removed, problems


def _stop_late_children(run_dir: Path, report: Progress, rounds: int = 3) -> list[str]:
    """SIGKILL marked processes started while the lab's services were being stopped.

    A service that runs a command when it gets SIGTERM (the responder reading Slurm
    back with ``scontrol``) leaves that child behind it, orphaned; with slurmctld already
    gone, ``scontrol`` would keep retrying for up to a minute. The child carries the
    lab's marker, so it is found here; a few rounds catch a child's own children.
    """
    survivors: list[str] = []
    for _ in range(rounds):
        late = procs.processes_marked(run_dir)
        if not late:
            break
        report(ProgressEvent("remove", "processes", f"stopping {len(late)} late processes"))
        survivors = procs.terminate(late, grace=0)
    return survivors


def _remove_kernel_objects(
    state: LabState | None,
    network: NetworkLayer,
    config: LabConfig,
    namespaces: set[str],
    foreign: set[str],
    report: Progress,
) -> tuple[list[str], list[str]]:
    """Recorded objects in reverse, the swept namespaces, and (when no other lab is in the
    way) every link with our names: namespaces first (their veth ends go with them), the
    bridge last; (removed, problems)."""
    planned: list[NetResource] = list(reversed(state.resources)) if state else []
    planned += [NetResource(kind="netns", name=n) for n in sorted(namespaces)]
    if not foreign:
        planned += [
            NetResource(kind="veth" if n != config.bridge else "bridge", name=n)
            for n in network.links()
            if config.owns_link(n)
        ]
    order = {"netns": 0, "veth": 1, "bridge": 2}
    unique = {(r.kind, r.name): r for r in planned}
    removed: list[str] = []
    problems: list[str] = []
    for resource in sorted(unique.values(), key=lambda r: order[r.kind]):
        try:
            if remove_resource(network, resource, report):
                removed.append(f"{resource.kind} {resource.name}")
        except LabError as exc:
            problems.append(str(exc))
    return removed, problems


__all__ = [
    "leftovers",
    "live_owner",
    "other_labs",
    "remove_resource",
    "removed_summary",
    "signals_deferred",
    "stop_processes",
    "stop_slurm",
    "teardown",
]
