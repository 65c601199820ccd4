"""Platform backends: how remedial actions and chaos target discovery reach the platform.

Shared by the responder's remedial actions (:mod:`stormwatch.alerts`) and the chaos
controller's target (:mod:`stormwatch.chaos.target`), so it lives in the shared home; it
may use :mod:`stormwatch.lab` (the lab's processes) and the trainer control-file model of
:mod:`stormwatch.faults`, and no other component.

One interface (:class:`PlatformBackend`, in :mod:`.base`), three platforms,
chosen by configuration (``stormwatch alerts serve --platform``):

* ``lab`` (:mod:`.lab`): local processes of the lab, signals and control files; what it
  knows of the lab comes from the target file ``lab up`` writes (:func:`read_lab_target`);
* ``kubernetes`` (:mod:`.kubernetes`): the official ``kubernetes`` client: delete
  pods, cordon and evict, Job/JobSet completion indexes for the rank placement;
* ``slurm`` (:mod:`.slurm`): ``squeue``/``scontrol``: requeue and start now, drain with a
  reason and exclude, each read back from Slurm (:mod:`.slurm_readback`); Slurm's job and
  node history for post-mortems (:mod:`.slurm_history`). On the Slurm lab (a ``slurm``
  target with a ``lab:`` section) the responder's backend is :class:`LabSlurmBackend`
  (:mod:`.lab_slurm`): Slurm for Slurm jobs, the lab's processes for jobs the lab launched
  directly (elastic ones).

:class:`PlatformSettings` is the YAML file of the platform-specific settings
(``--platform-config``), the same sections of a target file (:class:`TargetFile`,
:mod:`.targets`: platform, Prometheus, agents, credentials, job; ``--target``);
:func:`make_backend` builds the backend from it. :class:`AgentEndpoint` (:mod:`.endpoints`)
is where a node's agent is, on every platform.

Exceptions (:mod:`.errors`, drawn in :mod:`stormwatch.errors`)::

    PlatformError                   a platform backend failed
    ├── BackendError                a backend could not carry out an action or find the job
    │   └── NotStopped              a stop's processes, steps or pods not confirmed gone
    ├── InvalidTargetFile           a target file is not valid (a ConfigError too)
    └── InvalidManifest             a Kubernetes job manifest is not valid (a ConfigError too)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from stormwatch.errors import ConfigError
from stormwatch.platforms.base import (
    BACKEND_METHODS,
    PlatformBackend,
    arm_checkpoint,
    write_diagnostics,
)
from stormwatch.platforms.endpoints import AgentEndpoint
from stormwatch.platforms.errors import (
    BackendError,
    InvalidManifest,
    InvalidTargetFile,
    NotStopped,
    PlatformError,
    TargetIssue,
)
from stormwatch.platforms.lab import (
    LAB_TARGET_FILE,
    LabBackend,
    Worker,
    lab_placement,
    lab_target_path,
    read_lab_target,
)
from stormwatch.platforms.lab_slurm import LabSlurmBackend
from stormwatch.platforms.targets import (
    KubernetesSettings,
    PlatformSettings,
    SlurmSettings,
    TargetFile,
    load_target_file,
)
from stormwatch.yamltext import yaml_mapping

#: The platforms ``--platform`` accepts.
PLATFORMS = ("lab", "kubernetes", "slurm")
Platform = Literal["lab", "kubernetes", "slurm"]


def load_platform_settings(path: Path) -> PlatformSettings:
    """Read and validate a ``--platform-config`` YAML file.

    Raises:
        ConfigError: unreadable, not YAML, or invalid (the message names the field).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--platform-config: cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--platform-config: {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8 YAML"
        ) from exc
    data = yaml_mapping(
        text,
        f"--platform-config {path}",
        not_mapping="must be a mapping with the sections kubernetes, slurm, grace_period_s",
    )
    try:
        return PlatformSettings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors(include_url=False))
        raise ConfigError(f"--platform-config {path}: {problems}") from exc


def _problem(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        sections: dict[str, type[BaseModel]] = {
            "kubernetes": KubernetesSettings,
            "slurm": SlurmSettings,
        }
        section: type[BaseModel] = sections.get(str(err["loc"][0]), PlatformSettings)
        if len(err["loc"]) == 1:
            section = PlatformSettings
        return f"{where}: unknown key (valid keys: {', '.join(section.model_fields)})"
    if err["type"] == "string_pattern_mismatch" and err["loc"][-1] == "namespace":
        return (
            f"{where}: {err['input']!r} is not a Kubernetes namespace name "
            "(lowercase a-z, 0-9 and '-', at most 63)"
        )
    return f"{where}: {err['msg']}"


def make_backend(
    platform: str, settings: PlatformSettings, *, diagnostics_dir: Path
) -> PlatformBackend:
    """The ``kubernetes`` or ``slurm`` backend (the lab backend needs the lab's run
    directory: :meth:`LabBackend.for_lab`).

    Raises:
        ConfigError: ``platform`` is not ``kubernetes`` or ``slurm``.
        BackendError: the Kubernetes client finds no cluster configuration.
    """
    if platform == "kubernetes":
        from stormwatch.platforms.kubernetes import KubernetesBackend

        kube = settings.kubernetes
        return KubernetesBackend.connect(
            namespace=kube.namespace,
            diagnostics_dir=diagnostics_dir,
            job_label=kube.job_label,
            workload=kube.workload,
            control_dir=kube.control_dir,
            drain_node=kube.drain_node,
            grace_period_s=settings.grace_period_s,
            log_tail_lines=kube.log_tail_lines,
        )
    if platform == "slurm":
        from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands
        from stormwatch.platforms.slurm_readback import SlurmStop, SlurmWait

        slurm = settings.slurm
        return SlurmBackend(
            diagnostics_dir=diagnostics_dir,
            nproc_per_node=slurm.nproc_per_node,
            control_dir=slurm.control_dir,
            commands=SlurmCommands(conf=slurm.conf),
            wait=SlurmWait(timeout_s=slurm.readback_timeout_s),
            stop=SlurmStop(grace_s=settings.grace_period_s),
        )
    raise ConfigError(f"--platform: {platform!r} has no factory here; use kubernetes or slurm")


__all__ = [
    "BACKEND_METHODS",
    "LAB_TARGET_FILE",
    "PLATFORMS",
    "AgentEndpoint",
    "BackendError",
    "InvalidManifest",
    "InvalidTargetFile",
    "KubernetesSettings",
    "LabBackend",
    "LabSlurmBackend",
    "NotStopped",
    "Platform",
    "PlatformBackend",
    "PlatformError",
    "PlatformSettings",
    "SlurmSettings",
    "TargetFile",
    "TargetIssue",
    "Worker",
    "arm_checkpoint",
    "lab_placement",
    "lab_target_path",
    "load_platform_settings",
    "load_target_file",
    "make_backend",
    "read_lab_target",
    "write_diagnostics",
]
