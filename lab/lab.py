"""The local lab: a small cluster of network namespaces on one machine (:class:`Lab`).

``Lab.up`` creates, in order: the bridge, one namespace per node (veth pair,
address, loopback, resolvable peers), one agent per node inside its namespace,
then Prometheus, Alertmanager and the responder in the root namespace, and
waits until all of them are healthy and Prometheus scrapes every agent.

Every object is recorded in ``lab.json`` *before* it is created and its removal
is registered on an :class:`contextlib.ExitStack` right after (the creation is
:class:`~stormwatch.lab.builder.LabBuilder`'s), so a failed or interrupted ``up``
unwinds what it did, and ``down`` in a fresh process (even after ``up`` was
SIGKILLed) finds everything. ``down`` also sweeps by name
(the configuration's prefix) and by the environment marker every lab process
carries, and is idempotent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from stormwatch.clients import PrometheusClient
from stormwatch.lab import preflight, registry, teardown
from stormwatch.lab.builder import LabBuilder, describe_failure, never_raises
from stormwatch.lab.config import JobSpec, LabConfig
from stormwatch.lab.errors import (
    JobError,
    LabError,
    LabNotFoundError,
    LabNotUpError,
    LabOwnedElsewhereError,
)
from stormwatch.lab.jobs import launch
from stormwatch.lab.jobs.torchrun import base_environment
from stormwatch.lab.netns import IpRoute2, NetworkLayer
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.progress import Progress, ProgressEvent, quiet
from stormwatch.lab.services import definitions as services
from stormwatch.lab.services import procs
from stormwatch.lab.slurm.lab_cluster import lab_cluster
from stormwatch.lab.state import (
    JobInfo,
    JobRecord,
    JobResult,
    LabState,
    StateStore,
    plan_state,
)
from stormwatch.lab.status import LabStatus, collect_status
from stormwatch.lab.target_file import write_target_file


class Lab:
    """A lab in one run directory (the stand-in for a cluster's shared filesystem).

    Args:
        run_dir: the run directory; ``<run_dir>/lab.json`` is loaded when present.
        network: the network layer (default :class:`IpRoute2`); a seam for tests.
    """

    def __init__(self, run_dir: Path | str, *, network: NetworkLayer | None = None) -> None:
        self.paths = RunPaths.of(run_dir)
        self._store = StateStore(self.paths)
        self._network = network

    @property
    def run_dir(self) -> Path:
        return self.paths.run_dir

    @property
    def network(self) -> NetworkLayer:
        if self._network is None:
            self._network = IpRoute2()
        return self._network

    @property
    def state(self) -> LabState:
        """The current ``lab.json`` (read fresh on each access).

        Raises:
            LabNotUpError: there is no lab in the run directory.
        """
        return self._store.require()

    @property
    def marker(self) -> dict[str, str]:
        """The environment marker every process of this lab carries."""
        return {procs.LAB_MARKER_ENV: str(self.run_dir)}

    def prometheus(self) -> PrometheusClient:
        """A client for the lab's Prometheus."""
        return PrometheusClient(self.state.prometheus_url)

    # -- up ----------------------------------------------------------------------------
    def up(
        self,
        config: LabConfig | None = None,
        *,
        progress: Progress | None = None,
        force: bool = False,
    ) -> LabState:
        """Bring the lab up (see the module docstring) and return its state.

        A lab already up in this run directory with all processes running is
        returned as is when ``config`` is ``None`` or equal to its configuration
        (another configuration is an error). A lab that is up but has dead
        services (and all its namespaces and links) is repaired: only the dead
        services are restarted; jobs keep running and stay recorded. A stale or
        half-created lab is brought down first, but not while jobs of it run
        unless ``force``. ``None`` means :class:`LabConfig`'s defaults otherwise.

        Raises:
            LabPermissionError: not root (nor CAP_NET_ADMIN + CAP_SYS_ADMIN).
            LabOwnedElsewhereError: a lab in another run directory uses the prefix.
            PortInUseError: a root-namespace port is taken.
            ServiceFailedError: a service exited or did not become healthy within
                ``config.startup_timeout`` seconds (names it and its log file).
            LabError: anything else that kept the lab from coming up (among them:
                jobs run in a lab that would have to be rebuilt). In every case,
                what was created has been removed again (a repair keeps the lab).
        """
        report = progress or quiet
        preflight.require_privileges("lab up")
        with self._store.locked():
            existing = self._store.load()
            if existing is not None and existing.phase != "down":
                same = config is None or existing.config == config
                if existing.phase == "up" and self._all_running(existing):
                    if same:
                        report(ProgressEvent("info", "lab", f"lab already up in {self.run_dir}"))
                        self._write_target_file(existing)
                        return existing
                    raise LabError(
                        f"a lab with another configuration is up in {self.run_dir}; "
                        "bring it down first (`stormwatch lab down`)"
                    )
                if existing.phase == "up" and same and self._network_intact(existing):
                    return self._repair(existing, report)
                self._refuse_if_jobs_run(existing, force)
                report(ProgressEvent("info", "lab", "removing the remains of an earlier lab"))
                teardown.teardown(self._store, self.network, existing.config, report)
            config = config or LabConfig()
            self._refuse_if_owned_elsewhere(config, "lab up")
            preflight.require_binaries(config)
            preflight.require_free_ports(config)
            preflight.require_unused_names(config, self.network)
            state = plan_state(self.paths, config)
            self._store.save(state)
            LabBuilder.write_secrets(state, fresh=True)
            self._write_target_file(state)  # before the services: the responder reads it
            registry.claim(config.prefix, self.run_dir)
            undo = contextlib.ExitStack()
            builder = self._builder()
            try:
                builder.create(state, undo, report)
            except BaseException as exc:
                # Reporting may be what failed (a closed output pipe): never let it cut
                # the clean-up short.
                safe = never_raises(report)
                safe(ProgressEvent("info", "lab", "start failed; removing what was created"))
                with teardown.signals_deferred():
                    builder.unwind(undo, config, safe)
                    state.phase = "failed"
                    state.error = describe_failure(exc)
                    state.resources.clear()
                    state.processes.clear()
                    self._store.save(state)
                raise
            state.phase = "up"
            self._store.save(state)
            report(ProgressEvent("info", "lab", f"lab is up; state in {self.paths.state_file}"))
            return state

    def _write_target_file(self, state: LabState | None = None) -> None:
        """Write ``<run-dir>/target.yaml``, this lab as a target file
        (:mod:`stormwatch.lab.target_file`: a ``slurm`` target of the lab's cluster with a
        ``lab:`` section when jobs go through Slurm, else a ``lab`` target): what the chaos
        commands use without ``--target`` and what the responder acts with (``alerts serve
        --target``); its token files are written first (they must exist)."""
        if state is not None:
            LabBuilder.write_secrets(state)
        write_target_file(self.paths, state)

    def _dead_services(self, state: LabState) -> list[str]:
        names = [f"agent-{n.name}" for n in state.nodes] + list(services.ROOT_SERVICES)
        dead = [
            n for n in names if n not in state.processes or not procs.is_running(state.processes[n])
        ]
        return dead + self._dead_slurm(state)

    def _dead_slurm(self, state: LabState) -> list[str]:
        """The lab's Slurm daemons that died (``slurmctld``, ``slurmd@node1`` ...)."""
        if state.slurm is None:
            return []
        return lab_cluster(self.run_dir, state.config).dead_daemons()

    def _network_intact(self, state: LabState) -> bool:
        namespaces = set(self.network.namespaces())
        links = set(self.network.links())
        return state.bridge in links and all(n.netns in namespaces for n in state.nodes)

    def _refuse_if_jobs_run(self, state: LabState, force: bool) -> None:
        running = sorted(n for n, job in state.jobs.items() if launch.is_running(job))
        if not running or force:
            return
        dead = ", ".join(self._dead_services(state)) or "none"
        raise LabError(
            f"the lab in {self.run_dir} is {state.phase} and cannot be repaired in place "
            f"(dead services: {dead}; namespaces or links missing, or another configuration), "
            f"and job(s) {', '.join(running)} still run; rebuilding it would kill them. "
            "Stop them (`stormwatch lab stop --job NAME`), or `stormwatch lab down` then "
            "`stormwatch lab up`, or `stormwatch lab up --force` to rebuild anyway"
        )

    def _holds_lab_files(self) -> bool:
        """The run directory holds ``lab.json`` or another file the lab writes (the lock
        alone is not one: an earlier ``lab down`` here may have left only that)."""
        names = self.paths.lab_entries - {self.paths.lock_file.name}
        return any((self.run_dir / name).exists() for name in names)

    def _refuse_if_owned_elsewhere(self, config: LabConfig, action: str) -> None:
        others = teardown.other_labs(self.network, config, self.run_dir)
        if others:
            where = others[0]
            raise LabOwnedElsewhereError(
                f"{action}: prefix {config.prefix!r} belongs to the lab in {where}, not to "
                f"{self.run_dir}; is --run-dir mistyped? Bring that lab down with "
                f"`stormwatch lab down --run-dir {where}`, or choose another --prefix"
            )

    def _repair(self, state: LabState, report: Progress) -> LabState:
        """Restart only the dead services of a lab that is up; jobs are left alone."""
        dead = set(self._dead_services(state))
        self._write_target_file(state)  # before the services: the responder reads it
        report(ProgressEvent("info", "lab", f"restarting dead services: {', '.join(sorted(dead))}"))
        if state.slurm is not None and self._dead_slurm(state):
            cluster = lab_cluster(self.run_dir, state.config, env=base_environment(self.marker))
            restarted = cluster.restart_dead()
            report(ProgressEvent("ready", "slurm", f"restarted {', '.join(restarted)}"))
        self._builder().restart(state, dead, report)
        report(ProgressEvent("info", "lab", f"lab is up again; jobs kept ({len(state.jobs)})"))
        return state

    def restart_agents(
        self, nodes: Iterable[str], *, progress: Progress | None = None
    ) -> list[str]:
        """Start the agent of each of ``nodes`` again if it is dead (what a DaemonSet or
        systemd's ``Restart=`` does on a real cluster); running agents and jobs are left alone.

        Args:
            nodes: lab node names (``node1``) or namespace names (``sw-node1``).

        Returns:
            The services restarted (``agent-node1``), in order; empty when all ran.

        Raises:
            LabNotUpError: no lab is up in this run directory.
            LabError: a node is not one of the lab's (names the known ones).
            ServiceFailedError: a restarted agent did not become healthy in time.
        """
        report = progress or quiet
        with self._store.locked():
            state = self._store.load()
            if state is None or state.phase != "up":
                raise LabNotUpError(f"no lab is up in {self.run_dir} (`stormwatch lab up`)")
            names = {n.netns: n.name for n in state.nodes} | {n.name: n.name for n in state.nodes}
            wanted = []
            for node in nodes:
                if node not in names:
                    known = ", ".join(n.name for n in state.nodes)
                    raise LabError(f"the lab has no node {node!r} (nodes: {known})")
                wanted.append(f"agent-{names[node]}")
            dead = [n for n in dict.fromkeys(wanted) if n in self._dead_services(state)]
            if dead:
                self._builder().restart(state, set(dead), report)
            return dead

    def _all_running(self, state: LabState) -> bool:
        """Every service process and every Slurm daemon of the lab runs."""
        running = all(procs.is_running(p) for p in state.processes.values())
        return bool(state.processes) and running and not self._dead_slurm(state)

    def _builder(self) -> LabBuilder:
        """The collaborator that creates and restarts this lab's parts."""
        return LabBuilder(self.paths, self._store, self.network, base_environment(self.marker))

    # -- down --------------------------------------------------------------------------
    def down(
        self,
        config: LabConfig | None = None,
        *,
        progress: Progress | None = None,
        missing_ok: bool = True,
    ) -> list[str]:
        """Stop every process of the lab and remove its namespaces, links and files.

        Uses ``lab.json`` when present; ``config`` (default :class:`LabConfig`) names
        what to sweep when it is not. Safe to call twice, or after a crashed ``up``.
        ``missing_ok`` (the default; ``stormwatch lab down`` passes False): a run directory
        with nothing of a lab in it, and nothing of one left to sweep, is left as it is
        (not created) and nothing is returned.

        Returns:
            What was removed, one line each.

        Raises:
            LabPermissionError: not root.
            LabOwnedElsewhereError: there is no ``lab.json`` here and a lab in another
                run directory uses the prefix (nothing is touched).
            LabNotFoundError: without ``missing_ok``, the run directory does not exist or
                holds no file of a lab, and no process, namespace or link of one exists
                (nothing is created).
            LabError: something could not be removed (after trying everything else).
        """
        preflight.require_privileges("lab down")
        fallback = config or LabConfig()
        if not self._holds_lab_files():
            # Nothing here to lock or to read: a mistyped run directory is refused before
            # the lock creates it, unless the sweep has something of this lab to remove.
            self._refuse_if_owned_elsewhere(fallback, "lab down")
            if not teardown.leftovers(self.network, fallback, self.run_dir):
                if missing_ok:  # a caller cleaning up after a failed `up`, say
                    return []
                raise LabNotFoundError(
                    f"--run-dir: no lab in {self.run_dir} (no lab.json, and no process, "
                    f"namespace or link of a lab with prefix {fallback.prefix!r}); is it "
                    "mistyped? Give the run directory `lab up` used (./run unless --run-dir "
                    "or STORMWATCH_LAB_DIR said otherwise); nothing was touched"
                )
        with self._store.locked(), teardown.signals_deferred():
            state = self._store.load()
            if state is None:
                self._refuse_if_owned_elsewhere(fallback, "lab down")
            return teardown.teardown(
                self._store, self.network, state.config if state else fallback, progress or quiet
            )

    # -- status ------------------------------------------------------------------------
    def status(self) -> LabStatus:
        """Nodes, services (running, healthy), and jobs; probes every health URL once.

        Raises:
            LabNotUpError: there is no lab in the run directory.
        """
        return collect_status(self.state, self.network)

    # -- jobs --------------------------------------------------------------------------
    def start_job(self, spec: JobSpec) -> JobInfo:
        """Start ``spec`` on every node (detached) and return where its files and pids are.

        A job name may be reused once the earlier job has ended (the trainer then
        resumes from the checkpoints in its folder).

        Raises:
            LabNotUpError: the lab is not up.
            JobError: a job of that name is running, or torchrun could not be started.
        """
        with self._store.transaction() as state:
            if state.phase != "up":
                raise LabNotUpError(f"the lab in {self.run_dir} is {state.phase}, not up")
            earlier = state.jobs.get(spec.name)
            if earlier is not None and launch.is_running(earlier):
                raise JobError(
                    f"job {spec.name!r} is still running; stop it or choose another name"
                )
            record = launch.start(state, spec, self.paths, base_environment(self.marker))
            state.jobs[spec.name] = record
            return record.info

    def job(self, name: str) -> JobInfo:
        """The job called ``name`` (:class:`JobError` when unknown)."""
        return self.state.job(name).info

    def job_result(self, name: str) -> JobResult:
        """Exit codes so far, without waiting (``None`` for nodes still running)."""
        return launch.result(self.state.job(name))

    def wait_job(self, name: str, timeout: float = 600.0) -> JobResult:
        """Wait until every node's torchrun of job ``name`` has exited.

        Args:
            timeout: seconds to wait.

        Returns:
            The exit codes; when a node failed, ``detail`` names it with the last
            error lines of its torchrun log (e.g. the rendezvous port in use).

        Raises:
            JobTimeoutError: still running after ``timeout`` seconds.
        """
        return launch.wait(self.state.job(name), timeout, relaunch=lambda: self._relaunch(name))

    def rejoin_job_node(self, name: str, node: str) -> JobInfo:
        """Start ``node``'s torchrun again in the running elastic job ``name``: the node
        joins the rendezvous and the job grows back to include it.

        Raises:
            LabNotUpError: the lab is not up.
            JobError: the job is not elastic (``JobSpec.min_nodes``) or has ended, the
                node is unknown, or its torchrun still runs.
        """
        with self._store.transaction() as state:
            if state.phase != "up":
                raise LabNotUpError(f"the lab in {self.run_dir} is {state.phase}, not up")
            record = state.job(name)
            launch.rejoin(state, record, node, self.paths, base_environment(self.marker))
            return record.info

    def leave_job_node(self, name: str, node: str, grace: float | None = None) -> int | None:
        """``node`` leaves the running elastic job ``name`` gracefully (SIGTERM to its torchrun,
        SIGKILL of what is left after ``grace`` seconds, default the lab's
        :attr:`LabConfig.grace_period_s`); the job shrinks to the other nodes, and
        :meth:`rejoin_job_node` grows it back. Returns the torchrun's exit status.

        Raises:
            LabNotUpError: the lab is not up.
            JobError: see :func:`stormwatch.lab.jobs.launch.leave`.
        """
        state = self.state
        if state.phase != "up":
            raise LabNotUpError(f"the lab in {self.run_dir} is {state.phase}, not up")
        grace = state.config.grace_period_s if grace is None else grace
        return launch.leave(state.job(name), node, grace)

    def _relaunch(self, name: str) -> JobRecord | None:
        """FC-09 (:func:`jobs.relaunch_closed`): the relaunched job's record, or ``None``."""
        with self._store.transaction() as state:
            record = state.job(name)
            if launch.relaunch_closed(state, record, self.paths, base_environment(self.marker)):
                return record
        return None

    def stop_job(self, name: str, grace: float | None = None) -> JobResult:
        """SIGTERM the job's torchruns and workers, SIGKILL after ``grace`` seconds (default
        the lab's :attr:`LabConfig.grace_period_s`), until every process of it is gone.

        Raises:
            JobError: some process of the job is still running after SIGKILL.
        """
        state = self.state
        grace = state.config.grace_period_s if grace is None else grace
        result = launch.stop(state.job(name), grace=grace)
        with self._store.transaction() as state:
            state.job(name).stopped = True
        return result


__all__ = ["Lab"]
