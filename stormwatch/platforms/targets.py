"""The target file: where chaos experiments, game days and the responder act.

One YAML file describes a cluster: its ``platform`` (``slurm``, ``kubernetes``, or
``lab``: stormwatch's own lab with its ``direct`` scheduler; the Slurm lab writes a ``slurm``
target with a ``lab:`` section, :func:`lab_target_file`), its Prometheus (URL, TLS and auth: the fields of
:class:`~stormwatch.clients.http.HttpOptions` under ``http``), how to find the node
agents, the credentials, the job (attach to a running one by id or name, or submit
one from a template), and the platform settings the responder's backend uses (the
``slurm:`` and ``kubernetes:`` sections of :class:`PlatformSettings`: a target file
*is* a platform settings file with more sections). Example: deploy/slurm/target.yaml;
docs/deploy-slurm.md, "Run game days on your cluster".

:func:`load_target_file` reads and validates it before anything starts; every problem
is reported at once, with the file, its line, the field path and the fix
(:class:`~stormwatch.platforms.errors.InvalidTargetFile`, a ``ConfigError``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stormwatch.clients.http import HttpOptions, check_http_url
from stormwatch.platforms.base import control_dir_for
from stormwatch.platforms.errors import BackendError, InvalidTargetFile, TargetIssue
from stormwatch.platforms.stopping import DEFAULT_GRACE_PERIOD_S, GracePeriod
from stormwatch.platforms.target_issues import validation_issue
from stormwatch.platforms.target_values import (
    LOG_DIR_FIELDS,
    check_agent_host,
    check_file,
    check_parameters,
    check_placeholders,
    check_text_file,
    slurm_issues,
)
from stormwatch.yamltext import StrictLoader, key_lines, line_of, yaml_error_line, yaml_problem

#: Largest target file accepted (bytes); real ones are well under 1 KiB.
MAX_TARGET_BYTES = 64 * 1024
#: The platforms a target file can name.
TARGET_PLATFORMS = ("slurm", "kubernetes", "lab")
#: The agent's port in the Slurm recipe (deploy/slurm/train.sbatch ``STORMWATCH_AGENT_PORT``;
#: 9400 is dcgm-exporter's, see docs/deploy-slurm.md).
DEFAULT_AGENT_PORT = 9402
#: Kubernetes label selectors: ``key=value`` pairs (or bare keys), comma-separated.
_SELECTOR = re.compile(
    r"^[A-Za-z0-9./_-]+(!?=[A-Za-z0-9._-]*)?(,[A-Za-z0-9./_-]+(!?=[A-Za-z0-9._-]*)?)*$"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesSettings(_Strict):
    """``kubernetes:`` section (:class:`~.kubernetes.KubernetesBackend`; grace: top level)."""

    #: A DNS-1123 label, as Kubernetes requires of namespace names.
    namespace: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    job_label: str = Field(default="stormwatch.io/job", min_length=1)
    control_dir: Path | None = None
    drain_node: bool = False
    log_tail_lines: int = Field(default=200, ge=1)
    #: auto: a Job named like the job, else a JobSet, else pods by ``job_label``.
    workload: Literal["auto", "Job", "JobSet", "label"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "grace_period_s" in data:
            raise ValueError(
                "grace_period_s moved out of the kubernetes section: give it at the top "
                f"level, grace_period_s: {data['grace_period_s']} (one grace period, "
                "SIGTERM to SIGKILL, for every platform)"
            )
        return data


class SlurmSettings(_Strict):
    """``slurm:`` section (see :class:`~.slurm.SlurmBackend`).

    Attributes:
        nproc_per_node: torchrun ``--nproc-per-node`` of the recipe (ranks per node).
        control_dir: the trainer's control directory on the shared filesystem
            (``{job}``, ``{jobid}`` and ``{node}``, rank 0's node, substituted).
        conf: the cluster's ``slurm.conf`` (``SLURM_CONF`` of every command; None: the
            environment's or the system's); a target file's must exist (not a lab's).
        readback_timeout_s: longest wait for an action's effect to show in Slurm's state
            (s; :data:`~.slurm_readback.READBACK_TIMEOUT_S`).
    """

    nproc_per_node: int = Field(default=1, ge=1)
    control_dir: str | None = None
    conf: Path | None = None
    readback_timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("control_dir")
    @classmethod
    def _placeholders(cls, value: str | None) -> str | None:
        try:  # the backend's own substitution, on stand-in values
            control_dir_for(value or "", job="j", job_id="1", nodes=("n",))
        except BackendError as exc:
            raise ValueError(str(exc)) from exc
        return value


class PlatformSettings(_Strict):
    """The ``--platform-config`` file: per-platform settings (all optional); the same
    sections of a target file (:class:`TargetFile` extends it).

    Attributes:
        grace_period_s: seconds every stop or restart gives a job's processes between
            SIGTERM and SIGKILL, on every platform (:mod:`.stopping`): the lab's signals,
            Kubernetes' ``gracePeriodSeconds`` of deleted and evicted pods, and on Slurm
            the bound on a requeue's wait for the old steps to go (Slurm's own is
            ``KillWait``, which must not be longer: a target file's ``slurm.conf`` is
            checked). Default :data:`~.stopping.DEFAULT_GRACE_PERIOD_S`.
    """

    kubernetes: KubernetesSettings = Field(default_factory=lambda: KubernetesSettings())
    slurm: SlurmSettings = Field(default_factory=lambda: SlurmSettings())
    grace_period_s: GracePeriod = DEFAULT_GRACE_PERIOD_S


class PrometheusSection(_Strict):
    """``prometheus:``: the base ``url`` and ``http``, the fields of
    :class:`~stormwatch.clients.http.HttpOptions` (TLS, basic auth, Bearer token, headers)."""

    url: str
    http: HttpOptions = Field(default_factory=HttpOptions)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_http_url(value, "url", "http://prometheus.example:9090")


class AgentsSection(_Strict):
    """``agents:``: how to reach the node agents.

    Attributes:
        port: the agents' read-only listener (``--listen``; the Slurm recipe's 9402).
        fault_port: the fault API listener (``--fault-api-listen``); None: ``port``.
        scheme: ``http`` or ``https``.
        host: slurm: the agent's host per node, ``{node}`` (node name, the default) or
            ``{addr}`` (Slurm's ``NodeAddr``) substituted, e.g. ``{node}.ib.example``; a bare
            host name or IP once filled (:func:`~.target_values.check_agent_host`).
        namespace / selector: kubernetes: the agent DaemonSet's namespace (default the
            ``kubernetes.namespace``) and its pods' label selector (``app=stormwatch-agent``).
    """

    port: int = Field(default=DEFAULT_AGENT_PORT, ge=1, le=65535)
    fault_port: int | None = Field(default=None, ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    host: str = Field(default="{node}", pattern=r"\{(node|addr)\}")
    namespace: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    selector: str | None = Field(default=None, pattern=_SELECTOR.pattern)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return check_agent_host(value)


class CredentialsSection(_Strict):
    """``credentials:``: the agents' fault API token file, and the responder (optional)."""

    agent_token_file: Path | None = None
    responder_url: str | None = None
    responder_token_file: Path | None = None

    @field_validator("responder_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_http_url(value, "url", "http://host:19095")

    @field_validator("agent_token_file", "responder_token_file")
    @classmethod
    def _file(cls, value: Path | None) -> Path | None:
        return check_file(value, "give the file holding the token")


class AttachJob(_Strict):
    """``job.attach``: a running job, by Slurm job ``id`` or by ``name`` (one of them)."""

    id: str | None = Field(default=None, pattern=r"^[0-9]+(_[0-9]+)?$")
    name: str | None = Field(default=None, min_length=1)


class SubmitJob(_Strict):
    """``job.submit``: an sbatch script (or manifest) ``template`` and its ``parameters``
    (passed as environment variables; :func:`~.target_values.check_parameters`, and on
    Slurm no reserved name, :data:`~.target_values.RESERVED_PARAMETERS`). Kubernetes: a Job or JobSet manifest whose
    ``${NAME}`` placeholders the parameters and the run fill
    (:func:`~stormwatch.platforms.kubernetes.render_template`)."""

    template: Path
    parameters: dict[str, str] = Field(default_factory=dict)

    @field_validator("template")
    @classmethod
    def _template(cls, value: Path) -> Path:
        fix = "give the job script (train.sbatch) or manifest (job.yaml), saved as UTF-8"
        return check_text_file(value, fix)

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, value: dict[str, str]) -> dict[str, str]:
        check_parameters(value)
        return value


class JobTargetSection(_Strict):
    """``job:``: ``attach`` or ``submit`` (one of them), and ``log_dir``, the job's rank
    logs on the shared filesystem (``{job}`` substituted; default
    ``<run-dir>/jobs/{job}/logs``)."""

    attach: AttachJob | None = None
    submit: SubmitJob | None = None
    log_dir: str | None = None

    @field_validator("log_dir")
    @classmethod
    def _log_dir(cls, value: str | None) -> str | None:
        return None if value is None else check_placeholders(value, LOG_DIR_FIELDS)


class LabNode(_Strict):
    """One lab node: its ``name`` (``node0``) and its agent's ``metrics_dir`` (where the
    node's workers write, ``STORMWATCH_METRICS_DIR``; tells which node a worker runs on)."""

    name: str = Field(min_length=1)
    metrics_dir: Path


class LabSection(_Strict):
    """``lab:``: the lab's run directory and, as ``lab up`` writes them, its ``nodes`` in
    node-rank order and ``nproc_per_node`` (ranks per node); a hand-written lab target
    gives only ``run_dir`` and the lab's own target file in it supplies the rest
    (:func:`stormwatch.platforms.lab.read_lab_target`). On a ``slurm`` target it says
    that the cluster is a stormwatch lab: chaos starts its jobs through the lab."""

    run_dir: Path
    nodes: tuple[LabNode, ...] = ()
    nproc_per_node: int = Field(default=1, ge=1)


class TargetFile(PlatformSettings):
    """A target file (module docstring); validated by :func:`load_target_file`."""

    platform: Literal["slurm", "kubernetes", "lab"]
    prometheus: PrometheusSection | None = None
    agents: AgentsSection = Field(default_factory=AgentsSection)
    credentials: CredentialsSection = Field(default_factory=CredentialsSection)
    job: JobTargetSection | None = None
    lab: LabSection | None = None

    def platform_settings(self) -> PlatformSettings:
        """The ``slurm:``/``kubernetes:`` sections and the grace period, as the responder's
        backend takes them."""
        return PlatformSettings(
            kubernetes=self.kubernetes, slurm=self.slurm, grace_period_s=self.grace_period_s
        )


def lab_target_file(
    run_dir: Path,
    *,
    prometheus_url: str | None = None,
    nodes: Mapping[str, Path] | None = None,
    nproc_per_node: int = 1,
    grace_period_s: int = DEFAULT_GRACE_PERIOD_S,
) -> TargetFile:
    """The ``lab`` target file of the lab in ``run_dir`` (what ``lab up`` writes for its
    ``direct`` scheduler; a Slurm lab's is :func:`stormwatch.lab.target_file.lab_target`):
    its Prometheus (none when ``prometheus_url`` is None or empty), node name -> metrics
    directory in node-rank order, ranks per node, and its stops' grace period (s).

    Raises:
        pydantic.ValidationError: a value is not valid (a Prometheus URL that is not http(s)).
    """
    return TargetFile(
        platform="lab",
        grace_period_s=grace_period_s,
        lab=lab_section(run_dir, nodes=nodes, nproc_per_node=nproc_per_node),
        prometheus=PrometheusSection(url=prometheus_url) if prometheus_url else None,
    )


def lab_section(
    run_dir: Path, *, nodes: Mapping[str, Path] | None = None, nproc_per_node: int = 1
) -> LabSection:
    """The ``lab:`` section of the lab in ``run_dir`` (node name -> metrics directory)."""
    listed = tuple(LabNode(name=n, metrics_dir=Path(d)) for n, d in (nodes or {}).items())
    return LabSection(run_dir=Path(run_dir), nodes=listed, nproc_per_node=nproc_per_node)


def dump_target_file(target: TargetFile) -> str:
    """``target`` as target-file YAML (sections left at their defaults omitted)."""
    data = target.model_dump(mode="json", exclude_defaults=True)
    data = {"platform": target.platform, **data}
    return yaml.safe_dump(data, sort_keys=False)


def load_target_file(path: Path | str) -> TargetFile:
    """Read and validate a target file.

    Raises:
        InvalidTargetFile: missing, too large, not UTF-8, not YAML (duplicate keys and
            anchors refused), or invalid; every problem with its line, field and fix.
    """
    file = Path(path)
    try:
        with file.open("rb") as fh:
            data = fh.read(MAX_TARGET_BYTES + 1)
    except OSError as exc:
        problem = f"cannot read the file: {exc.strerror or exc}"
        raise InvalidTargetFile(file, [TargetIssue("", problem)]) from exc
    if len(data) > MAX_TARGET_BYTES:
        too_large = f"larger than {MAX_TARGET_BYTES // 1024} KiB; a target file is a few lines"
        raise InvalidTargetFile(file, [TargetIssue("", too_large)])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        issue = TargetIssue("", f"not UTF-8 text (byte {exc.start}): save it as UTF-8", line)
        raise InvalidTargetFile(file, [issue]) from exc
    return parse_target_file(text, file)


class _TargetLoader(StrictLoader):
    kind = "target files"


def parse_target_file(text: str, file: Path | str = "<target>") -> TargetFile:
    """Validate target-file YAML ``text``; ``file`` names it in messages and relative paths
    in it (token files, templates, the lab's run dir) are taken from its folder.

    Raises:
        InvalidTargetFile: see :func:`load_target_file`.
    """
    try:
        data = yaml.load(text, Loader=_TargetLoader)
    except yaml.YAMLError as exc:
        line = yaml_error_line(exc, text)
        raise InvalidTargetFile(
            file, [TargetIssue("", f"not valid YAML: {yaml_problem(exc, text)}", line)]
        ) from exc
    except RecursionError as exc:
        raise InvalidTargetFile(file, [TargetIssue("", "nested too deeply to read")]) from exc
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        keys = ", ".join(TargetFile.model_fields)
        raise InvalidTargetFile(
            file, [TargetIssue("", f"must be a mapping with keys {keys} (got {kind})")]
        )
    _relative_to(data, Path(file).absolute().parent)
    try:
        target = TargetFile.model_validate(data)
    except pydantic.ValidationError as exc:
        issues = [validation_issue(err, TargetFile) for err in exc.errors(include_url=False)]
    else:
        issues = platform_issues(target)
    if issues:
        lines = key_lines(text, _TargetLoader)
        located = [TargetIssue(i.path, i.message, line_of(i.path, lines)) for i in issues]
        raise InvalidTargetFile(file, located)
    return target


#: Fields holding paths, taken relative to the target file's folder.
_PATHS = (
    ("credentials", "agent_token_file"),
    ("credentials", "responder_token_file"),
    ("lab", "run_dir"),
    ("lab", "nodes", "*", "metrics_dir"),
    ("prometheus", "http", "ca_file"),
    ("prometheus", "http", "cert_file"),
    ("prometheus", "http", "key_file"),
    ("prometheus", "http", "bearer_token_file"),
    ("job", "submit", "template"),
    ("slurm", "conf"),
)


def _relative_to(data: dict[str, Any], folder: Path) -> None:
    for *parents, name in _PATHS:
        sections: list[Any] = [data]
        for key in parents:  # "*": every item of a list
            if key == "*":
                sections = [i for s in sections if isinstance(s, list) for i in s]
            else:
                sections = [s.get(key) if isinstance(s, dict) else None for s in sections]
        for section in sections:
            if isinstance(section, dict) and isinstance(section.get(name), str):
                value = Path(section[name]).expanduser()
                section[name] = str(value if value.is_absolute() else folder / value)


def platform_issues(target: TargetFile) -> list[TargetIssue]:
    """The problems that span fields: what each platform needs and refuses."""
    issues: list[TargetIssue] = []
    given = target.model_fields_set
    if target.platform == "lab":
        if target.lab is None:
            issues.append(TargetIssue("lab", "required for platform lab: lab: {run_dir: run}"))
        for name in sorted(given - {"platform", "lab", "prometheus", "grace_period_s"}):
            issues.append(
                TargetIssue(name, "not used by platform lab (the lab's lab.json has it); remove it")
            )
        return issues
    if target.lab is not None and (target.platform != "slurm" or target.job is not None):
        issues.append(
            TargetIssue(
                "lab",
                "only for platform lab, or for a Slurm lab's slurm target (no job: there, "
                f"the lab starts the jobs); remove it from this {target.platform} target",
            )
        )
    if target.prometheus is None and target.lab is None:  # else the lab's lab.json has it
        issues.append(
            TargetIssue("prometheus", "required: prometheus: {url: http://prometheus.example:9090}")
        )
    if target.lab is None:  # the lab starts its own jobs
        issues.extend(_job_issues(target.job))
    if target.platform == "slurm" and target.lab is None:  # a lab writes its own slurm.conf
        issues.extend(slurm_issues(target))
    agents = target.agents
    if target.platform == "kubernetes":
        if agents.selector is None:
            issues.append(
                TargetIssue(
                    "agents.selector",
                    "required for kubernetes: the label selector of the agent DaemonSet's "
                    "pods, e.g. app.kubernetes.io/name=stormwatch-agent",
                )
            )
        if agents.host != "{node}":
            issues.append(TargetIssue("agents.host", "only for slurm (kubernetes uses pod IPs)"))
        issues.extend(_kubernetes_issues(target))
    else:
        for name in ("selector", "namespace"):
            if getattr(agents, name) is not None:
                issues.append(TargetIssue(f"agents.{name}", "only for kubernetes; remove it"))
    return issues


def _kubernetes_issues(target: TargetFile) -> list[TargetIssue]:
    try:  # the client is an optional dependency (the kubernetes extra)
        from stormwatch.platforms.kubernetes.target_checks import target_issues
    except ImportError as exc:
        need = f"needs the kubernetes client ({exc}): pip install 'stormwatch[kubernetes]'"
        return [TargetIssue("platform", need)]
    return target_issues(target)


def _job_issues(job: JobTargetSection | None) -> list[TargetIssue]:
    if job is None:
        return [
            TargetIssue("job", "required: job: {attach: {name: <job name>}} or job: {submit: ...}")
        ]
    issues = []
    if (job.attach is None) == (job.submit is None):
        issues.append(TargetIssue("job", "give exactly one of attach and submit"))
    if job.attach is not None and (job.attach.id is None) == (job.attach.name is None):
        issues.append(TargetIssue("job.attach", "give exactly one of id and name"))
    return issues


__all__ = [
    "DEFAULT_AGENT_PORT",
    "MAX_TARGET_BYTES",
    "TARGET_PLATFORMS",
    "AgentsSection",
    "AttachJob",
    "CredentialsSection",
    "JobTargetSection",
    "KubernetesSettings",
    "LabNode",
    "LabSection",
    "PlatformSettings",
    "PrometheusSection",
    "SlurmSettings",
    "SubmitJob",
    "TargetFile",
    "dump_target_file",
    "lab_section",
    "lab_target_file",
    "load_target_file",
    "parse_target_file",
    "platform_issues",
]
