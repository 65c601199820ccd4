"""Taking a lab apart: stop its processes, delete its namespaces, veths and bridge.

Used by ``lab down``, by a failed or interrupted ``lab up`` (after its own
undo stack ran) and before ``lab up`` reuses a run directory. Everything here
is idempotent: a missing process or object is not an error.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from stormwatch.chaos.lab import jobs, procs
from stormwatch.chaos.lab.config import LabConfig
from stormwatch.chaos.lab.errors import LabError
from stormwatch.chaos.lab.netns import NetworkLayer
from stormwatch.chaos.lab.progress import Progress, ProgressEvent
from stormwatch.chaos.lab.state import NetResource, ProcessRecord, StateStore


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
    removed: list[str] = []
    problems: list[str] = []

    # 1. Processes: recorded ones (jobs first, they talk to the agents), then sweeps.
    records: list[ProcessRecord] = []
    interrupted_jobs: list[str] = []
    if state is not None:
        interrupted_jobs = [n for n, job in state.jobs.items() if jobs.is_running(job)]
        records += [p for job in state.jobs.values() for p in job.processes.values()]
        records += list(state.processes.values())
    alive = {record.name: procs.tree(record) for record in records}
    victims = {proc.pid: proc for tree in alive.values() for proc in tree}
    namespaces = {n for n in network.namespaces() if config.owns_netns(n)}
    if state is not None:
        namespaces |= {r.name for r in state.resources if r.kind == "netns"}
    for name in namespaces:
        for proc in procs.namespace_processes(network.namespace_pids(name)):
            victims.setdefault(proc.pid, proc)
    for proc in procs.processes_marked(store.run_dir):
        victims.setdefault(proc.pid, proc)
    if victims:
        report(ProgressEvent("remove", "processes", f"stopping {len(victims)} processes"))
        survivors = procs.terminate(victims.values())
        problems += [f"{s} survived SIGKILL" for s in survivors]
        removed += [f"process {name}" for name, tree in alive.items() if tree]
        unrecorded = len(victims) - sum(len(tree) for tree in alive.values())
        if unrecorded > 0:
            removed.append(f"{unrecorded} unrecorded processes")

    # 2. Kernel objects: recorded ones in reverse, then anything with our names.
    planned: list[NetResource] = list(reversed(state.resources)) if state else []
    planned += [NetResource(kind="netns", name=n) for n in sorted(namespaces)]
    planned += [
        NetResource(kind="veth" if n != config.bridge else "bridge", name=n)
        for n in network.links()
        if config.owns_link(n)
    ]
    # Namespaces first: their veth ends disappear with them; the bridge last.
    order = {"netns": 0, "veth": 1, "bridge": 2}
    unique = {(r.kind, r.name): r for r in planned}
    for resource in sorted(unique.values(), key=lambda r: order[r.kind]):
        try:
            if remove_resource(network, resource, report):
                removed.append(f"{resource.kind} {resource.name}")
        except LabError as exc:
            problems.append(str(exc))

    if state is not None:
        state.phase = "down"
        state.resources.clear()
        state.processes.clear()
        for name in interrupted_jobs:
            state.jobs[name].stopped = True
        store.save(state)
    if problems:
        raise LabError("lab down left things behind: " + "; ".join(problems))
    return removed


__all__ = ["remove_resource", "signals_deferred", "stop_processes", "teardown"]
