"""The runner's :class:`~stormwatch.chaos.target.Target` of a ``kubernetes`` target file.

* **Agents**: the Ready pods of the agent DaemonSet (``agents.namespace``, default the
  ``kubernetes.namespace``; ``agents.selector``), each at ``<scheme>://<pod IP>:<port>`` of
  its container port named ``metrics`` (fault API: the port named ``fault-api``)
  (:func:`~stormwatch.platforms.kubernetes.discover_agents`).
* **The job**, one of:

  - ``job.attach.name``: a running Job, indexed Job, JobSet, or pods labelled
    ``<kubernetes.job_label>=<name>`` (``kubernetes.workload``); the world size is its
    ranks now (:meth:`~stormwatch.platforms.kubernetes.KubernetesBackend.ranks`);
  - ``job.submit``: a Job or JobSet manifest ``template`` with ``parameters``
    (:func:`~stormwatch.platforms.kubernetes.render_template`). Building the target
    creates nothing (``chaos run --dry-run`` builds it too): the runner's start creates
    the workload through the official client (``create_namespaced_job``, or the JobSet
    through ``CustomObjectsApi``) under the run's job name (``${STORMWATCH_JOB}``), then
    waits for its ranks to step as for any job. The world size is the manifest's.

* **Job state** (:class:`KubernetesJobs`): ``exited`` reads the workload's status
  conditions (Job ``Complete``/``Failed``, JobSet ``Completed``/``Failed``;
  :func:`~stormwatch.platforms.kubernetes.read_outcome`); ``ended``: no live pod is left;
  ``stop`` deletes a workload this run created (background propagation) and refuses one
  it attached to.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from stormwatch.chaos.errors import ChaosError, LabNotReady
from stormwatch.chaos.experiment.model import JobSection
from stormwatch.chaos.platform_target import JobLogDirs, build_target
from stormwatch.chaos.target import Target
from stormwatch.contracts.journal import JobRef
from stormwatch.platforms.errors import BackendError, InvalidManifest
from stormwatch.platforms.targets import SubmitJob, TargetFile

if TYPE_CHECKING:
    from stormwatch.platforms.kubernetes import KubernetesBackend, Workload

logger = logging.getLogger(__name__)


class KubernetesJobs:
    """The :class:`~stormwatch.chaos.target.JobControl` of a Kubernetes target (module
    docstring): it attaches to the job ``attached`` names, or starts the ``submit``
    template (one of them).

    Args:
        backend: the namespace's backend (its API seam, namespace and workload lookup).
        attached: the job to attach to; None with ``submit``.
        submit: the target file's ``job.submit``; None with ``attached``.
        target: the target file (its ``job.log_dir``) and ``run_dir``: where rank logs are.
        world_size: ranks of the job (the attached job's, or the manifest's).
    """

    def __init__(
        self,
        backend: KubernetesBackend,
        *,
        attached: str | None,
        submit: SubmitJob | None,
        target: TargetFile,
        run_dir: Path,
        world_size: int,
    ) -> None:
        self._backend = backend
        self._attached = attached
        self._submit = submit
        self._target = target
        self._run_dir = Path(run_dir)
        self._world_size = world_size
        self._workloads: dict[str, Workload] = {}
        self._started: set[str] = set()

    def log_dir(self, name: str) -> Path:
        """Job ``name``'s rank logs (``job.log_dir``, ``{job}`` substituted)."""
        return JobLogDirs.of(self._target, self._run_dir)(name, "")

    def _job_ref(self, name: str, *, started: bool) -> JobRef:
        return JobRef(
            name=name,
            log_dir=self.log_dir(name),
            world_size=self._world_size,
            started_by_runner=started,
        )

    def _workload(self, name: str) -> Workload:
        if name not in self._workloads:
            self._workloads[name] = self._backend.find(name)
        return self._workloads[name]

    def start(self, job: JobSection) -> JobRef:
        """Create the template's workload for ``job`` (its name with ``_`` as ``-``, a
        Kubernetes name, is ``${STORMWATCH_JOB}``).

        Raises:
            ChaosError: the target attaches instead, the rendered manifest is not valid,
                or the API refused (a 409: a job of that name exists).
        """
        from stormwatch.platforms.kubernetes import render_template, start_job

        if self._submit is None:
            raise ChaosError(
                f"cannot start job {job.name!r} on kubernetes: the target attaches to job "
                f"{self._attached!r} (job.attach); give job.submit to start one"
            )
        if job.command is not None:
            raise ChaosError(
                f"job.command: job {job.name!r} names its own program, but on kubernetes the "
                "job.submit template's containers say what runs; remove job.command and put "
                "the command in the template"
            )
        run = {
            "STORMWATCH_JOB": job.name.replace("_", "-"),
            "STORMWATCH_STEPS": str(job.steps),
            "STORMWATCH_CHECKPOINT_EVERY": str(job.checkpoint_every),
        }
        try:
            manifest = render_template(self._submit.template, self._submit.parameters, run)
            workload = start_job(self._backend.api, self._backend.namespace, manifest.body)
        except (InvalidManifest, BackendError) as exc:
            raise ChaosError(f"could not start job {run['STORMWATCH_JOB']!r}: {exc}") from exc
        self._workloads[workload.name] = workload
        self._started.add(workload.name)
        return self._job_ref(workload.name, started=True)

    def attach(self, name: str) -> JobRef:
        """The running job ``name`` (it must have a live pod).

        Raises:
            LabNotReady: no live worker, or the API refused.
        """
        try:
            workload, _ = self._backend.pods(name)
            self._workloads.setdefault(name, workload)
        except BackendError as exc:
            raise LabNotReady(str(exc)) from exc
        return self._job_ref(name, started=name in self._started)

    def exited(self, name: str) -> bool | None:
        """True/False once the workload's status says Complete(d)/Failed; None while it
        runs, for pods by label, and when the status cannot be read (logged)."""
        from stormwatch.platforms.kubernetes import read_outcome

        try:
            return read_outcome(self._backend.api, self._workload(name))
        except BackendError as exc:
            logger.warning("job %s: status unknown: %s", name, exc)
            return None

    def ended(self, name: str) -> bool:
        """No live pod of the job is left (torchrun's shutdown included)."""
        try:
            return not self._backend.live_pods(self._workload(name))
        except BackendError as exc:
            logger.warning("job %s: pods unknown: %s", name, exc)
            return False

    def stop(self, name: str) -> None:
        """Delete the workload this run created (its pods go with it, ``gracePeriodSeconds``
        = the target's grace period) and wait until none of its pods runs
        (:meth:`KubernetesBackend.wait_pods_gone`).

        Raises:
            ChaosError: the job was not started by this run, the API refused, or a pod
                still ran after the grace period and its margin.
        """
        from stormwatch.platforms.kubernetes import delete_workload

        if name not in self._started:
            raise ChaosError(f"cannot stop job {name!r}: it was not started by stormwatch chaos")
        backend, workload = self._backend, self._workload(name)
        try:
            delete_workload(backend.api, workload, grace_period_s=backend.grace_period_s)
            backend.wait_pods_gone(workload, did=f"deleted {workload.describe()}")
        except BackendError as exc:
            raise ChaosError(f"could not stop job {name!r}: {exc}") from exc


def _connect(target: TargetFile, run_dir: Path) -> KubernetesBackend:
    from stormwatch.platforms.kubernetes import KubernetesBackend

    kube = target.kubernetes
    try:
        return KubernetesBackend.connect(
            namespace=kube.namespace,
            diagnostics_dir=Path(run_dir) / "chaos" / "diagnostics",
            job_label=kube.job_label,
            control_dir=kube.control_dir,
            workload=kube.workload,
            grace_period_s=target.grace_period_s,
        )
    except BackendError as exc:
        raise LabNotReady(str(exc)) from exc


def _world_size(backend: KubernetesBackend, attached: str | None, submit: SubmitJob | None) -> int:
    from stormwatch.platforms.kubernetes import CHECK_VALUES, render_template

    if submit is None:
        return len(backend.ranks(attached or ""))
    try:
        return render_template(submit.template, submit.parameters, CHECK_VALUES).world_size
    except InvalidManifest as exc:  # the target file was checked; the file changed since
        raise LabNotReady(f"job.submit.template: {exc}") from exc


def kubernetes_target(
    target: TargetFile, run_dir: Path, *, backend: KubernetesBackend | None = None
) -> Target:
    """The :class:`Target` of a ``kubernetes`` target file (module docstring); ``backend``
    defaults to one on the in-cluster service account, else ``~/.kube/config``.

    Raises:
        LabNotReady: an attached job has no live pod, no agent pod is Ready, no cluster
            configuration, or an API call failed.
    """
    from stormwatch.platforms.kubernetes import discover_agents

    backend = backend if backend is not None else _connect(target, run_dir)
    job = target.job
    if job is None or (job.submit is None and (job.attach is None or job.attach.name is None)):
        raise LabNotReady("kubernetes targets need job.attach.name or job.submit")
    attached = job.attach.name if job.attach is not None else None
    agents = target.agents
    try:
        world_size = _world_size(backend, attached, job.submit)
        found = discover_agents(
            backend.api,
            namespace=agents.namespace or backend.namespace,
            selector=agents.selector or "",
            scheme=agents.scheme,
        )
    except BackendError as exc:
        raise LabNotReady(str(exc)) from exc
    if not found:
        raise LabNotReady(f"agents.selector {agents.selector}: no Ready agent pod")
    jobs = KubernetesJobs(
        backend,
        attached=attached,
        submit=job.submit,
        target=target,
        run_dir=run_dir,
        world_size=world_size,
    )
    return build_target(
        target,
        run_dir,
        jobs=jobs,
        world_size=world_size,
        agents=tuple(found[node] for node in sorted(found)),
        placement=backend,
        attach_job=attached,
        words=_words(attached, job.submit),
    )


def _words(attached: str | None, submit: SubmitJob | None) -> tuple[str, str]:
    """The target and how to change its job's size, in words (``build_target``'s ``words``)."""
    if submit is None:
        return f"Kubernetes job {attached}", "attach to a job of that size (job.attach)"
    return f"a job of {submit.template.name}", "change the manifest's parallelism or replicas"


__all__ = ["KubernetesJobs", "kubernetes_target"]
