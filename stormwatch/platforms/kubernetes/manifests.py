"""Job manifests: a Job (indexed or not) or a JobSet, checked before anything is sent.

:func:`check_manifest` validates one object with the official client's typed models (a
Job as ``V1Job``; each of a JobSet's ``spec.replicatedJobs[].template`` as
``V1JobTemplateSpec``; unknown fields and wrong types fail, naming the field) and says
how many ranks it runs (:attr:`Manifest.world_size`).

:func:`render_template` makes one from a target file's ``job.submit`` (``template`` and
``parameters``): every ``${NAME}`` in the template is replaced by the parameter ``NAME``,
or by what the run supplies (:data:`RUN_PARAMETERS`: the run's job name, steps and
checkpoint interval); ``$${NAME}`` stays a literal ``${NAME}``; Kubernetes' own
``$(VAR)`` expansion is left alone. The result must be exactly one YAML document.

Every problem raises :class:`~stormwatch.platforms.errors.InvalidManifest` naming the field
(``metadata.name``, ``kind``, ``spec.completion``, ...) and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from kubernetes import client as k8s
from pydantic import ValidationError

from stormwatch.platforms.errors import InvalidManifest
from stormwatch.platforms.kubernetes.api import JOBSET_GROUP, JOBSET_VERSION
from stormwatch.yamltext import yaml_problem

#: ``${NAME}`` placeholders the run fills: the job's name (``<experiment job>-<run>``, a
#: DNS label), the experiment's ``job.steps`` and ``job.checkpoint_every``.
RUN_PARAMETERS = ("STORMWATCH_JOB", "STORMWATCH_STEPS", "STORMWATCH_CHECKPOINT_EVERY")
#: What the run parameters are while a target file is checked (no run yet).
CHECK_VALUES = {
    "STORMWATCH_JOB": "stormwatch-check",
    "STORMWATCH_STEPS": "1",
    "STORMWATCH_CHECKPOINT_EVERY": "1",
}
#: A Job's name becomes its pods' ``job-name`` label and, indexed, their hostnames
#: (``<name>-<index>``): a DNS-1123 label, at most 63 characters.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PLACEHOLDER = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: Fields of one ``spec.replicatedJobs`` item (JobSet v1alpha2 CRD).
_REPLICATED_JOB_FIELDS = frozenset({"name", "replicas", "template", "dependsOn", "groupName"})
#: Largest template read (bytes); a job manifest is a few KiB.
MAX_TEMPLATE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Manifest:
    """A checked job manifest: its ``kind``, ``name``, the ``body`` to send, and
    ``world_size`` (pods x ranks per pod, the literal ``PET_NPROC_PER_NODE``, default 1)."""

    kind: Literal["Job", "JobSet"]
    name: str
    body: dict[str, Any]
    world_size: int


def _invalid(exc: ValidationError, prefix: str, what: str) -> InvalidManifest:
    """One error for every problem pydantic found, at the first one's field."""
    found = []
    for error in exc.errors(include_url=False):
        path = prefix
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        found.append((path.strip("."), str(error["msg"])))
    more = "".join(f"; {path}: {msg}" for path, msg in found[1:])
    return InvalidManifest(found[0][0], f"{found[0][1]} (not a valid {what}){more}")


def _nproc(pod_spec: k8s.V1PodSpec | None, where: str) -> int:
    for container in (pod_spec.containers if pod_spec else None) or []:
        for var in container.env or []:
            if var.name == "PET_NPROC_PER_NODE" and var.value is not None:
                if not str(var.value).isdigit() or int(var.value) < 1:
                    raise InvalidManifest(
                        f"{where}.env[PET_NPROC_PER_NODE]",
                        f"{var.value!r} is not a positive integer (torchrun --nproc-per-node)",
                    )
                return int(var.value)
        break  # the first container runs torchrun
    return 1


def _job_pods_x_ranks(spec: k8s.V1JobSpec | None, where: str) -> int:
    pods = (spec.parallelism if spec and spec.parallelism is not None else 1) or 0
    pod_spec = spec.template.spec if spec and spec.template else None
    return pods * _nproc(pod_spec, f"{where}.template.spec.containers[0]")


def _check_job(data: Mapping[str, Any], name: str) -> Manifest:
    if data.get("apiVersion") != "batch/v1":
        raise InvalidManifest("apiVersion", f"{data.get('apiVersion')!r}: a Job is batch/v1")
    try:
        job = k8s.V1Job.model_validate(dict(data))
    except ValidationError as exc:
        raise _invalid(exc, "", "batch/v1 Job") from exc
    return Manifest("Job", name, dict(data), _job_pods_x_ranks(job.spec, "spec"))


def _check_replicated_job(item: Any, where: str) -> int:
    if not isinstance(item, Mapping):
        raise InvalidManifest(where, "must be a mapping with name, replicas and template")
    unknown = sorted(set(item) - _REPLICATED_JOB_FIELDS)
    if unknown:
        valid = ", ".join(sorted(_REPLICATED_JOB_FIELDS))
        raise InvalidManifest(f"{where}.{unknown[0]}", f"unknown field (valid: {valid})")
    if not isinstance(item.get("name"), str) or not _DNS_LABEL.match(item["name"]):
        raise InvalidManifest(f"{where}.name", "required: a DNS label (lowercase a-z, 0-9, '-')")
    replicas = item.get("replicas", 1)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise InvalidManifest(f"{where}.replicas", f"{replicas!r} is not a count (0 or more)")
    if not isinstance(item.get("template"), Mapping):
        raise InvalidManifest(f"{where}.template", "required: a batch/v1 JobTemplateSpec")
    try:
        template = k8s.V1JobTemplateSpec.model_validate(dict(item["template"]))
    except ValidationError as exc:
        raise _invalid(exc, f"{where}.template", "Job template") from exc
    return replicas * _job_pods_x_ranks(template.spec, f"{where}.template.spec")


def _check_jobset(data: Mapping[str, Any], name: str) -> Manifest:
    api_version = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
    if data.get("apiVersion") != api_version:
        raise InvalidManifest(
            "apiVersion", f"{data.get('apiVersion')!r}: this JobSet API is {api_version}"
        )
    replicated = (data.get("spec") or {}).get("replicatedJobs")
    if not isinstance(replicated, list) or not replicated:
        raise InvalidManifest("spec.replicatedJobs", "required: a list of replicated Jobs")
    world = sum(
        _check_replicated_job(item, f"spec.replicatedJobs[{i}]")
        for i, item in enumerate(replicated)
    )
    return Manifest("JobSet", name, dict(data), world)


def check_manifest(data: Any) -> Manifest:
    """``data`` as a :class:`Manifest` (module docstring).

    Raises:
        InvalidManifest: not a mapping; ``kind`` not Job or JobSet; ``metadata.name``
            missing or not a DNS label; a field the API does not have, or of the wrong type.
    """
    if not isinstance(data, Mapping):
        got = "empty" if data is None else type(data).__name__
        raise InvalidManifest(
            "", f"must be a mapping (apiVersion, kind, metadata, spec), got {got}"
        )
    kind = data.get("kind")
    if kind not in ("Job", "JobSet"):
        raise InvalidManifest(
            "kind", f"{kind!r} is not Job or JobSet (an indexed Job is a Job with completionMode)"
        )
    name = (data.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise InvalidManifest("metadata.name", "required: the job's name (or ${STORMWATCH_JOB})")
    if not _DNS_LABEL.match(name):
        raise InvalidManifest(
            "metadata.name",
            f"{name!r} is not a DNS label (lowercase a-z, 0-9 and '-', at most 63 characters)",
        )
    return _check_job(data, name) if kind == "Job" else _check_jobset(data, name)


def _substitute(text: str, parameters: Mapping[str, str], run: Mapping[str, str]) -> str:
    values = {**parameters, **run}

    def fill(match: re.Match[str]) -> str:
        escaped, name = match.group(1), match.group(2)
        if escaped:
            return "${" + name + "}"
        if name not in values:
            given = ", ".join(sorted(parameters)) or "none"
            line = text.count("\n", 0, match.start()) + 1
            raise InvalidManifest(
                "parameters",
                f"line {line} uses ${{{name}}}, which no parameter fills (parameters: "
                f"{given}; the run fills {', '.join(RUN_PARAMETERS)}); add it to "
                f"job.submit.parameters, or write $${{{name}}} for a literal",
            )
        return values[name]

    return _PLACEHOLDER.sub(fill, text)


def render_template(
    template: Path, parameters: Mapping[str, str], run: Mapping[str, str]
) -> Manifest:
    """The manifest of ``template`` with its placeholders filled from ``parameters`` and
    ``run`` (values of :data:`RUN_PARAMETERS`), checked (:func:`check_manifest`).

    Raises:
        InvalidManifest: unreadable, too large, a placeholder nobody fills, a parameter
            named like a run parameter, not YAML, not exactly one document, or invalid.
    """
    source = str(template)
    reserved = sorted(set(parameters) & set(RUN_PARAMETERS))
    if reserved:
        raise InvalidManifest(
            "parameters",
            f"{reserved[0]} is filled by the run; give the parameter another name",
            source=source,
        )
    try:
        with Path(template).open("rb") as fh:
            raw = fh.read(MAX_TEMPLATE_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidManifest("", f"cannot read it as UTF-8 text: {exc}", source=source) from exc
    if len(raw) > MAX_TEMPLATE_BYTES:
        too_large = f"larger than {MAX_TEMPLATE_BYTES // 1024} KiB; a job manifest is a few KiB"
        raise InvalidManifest("", too_large, source=source)
    try:
        filled = _substitute(text, parameters, run)
    except InvalidManifest as exc:
        raise InvalidManifest(exc.field, exc.problem, source=source) from exc
    try:
        docs = [d for d in yaml.safe_load_all(filled) if d is not None]
    except yaml.YAMLError as exc:
        raise InvalidManifest(
            "",
            f"not YAML with its parameters filled in: {yaml_problem(exc, filled)}",
            source=source,
        ) from exc
    if len(docs) != 1:
        kinds = ", ".join(str(d.get("kind") if isinstance(d, dict) else d) for d in docs)
        raise InvalidManifest(
            "",
            f"holds {len(docs)} documents ({kinds or 'none'}); give exactly one Job or JobSet "
            "(create a rendezvous Service or a volume claim with kubectl first)",
            source=source,
        )
    try:
        return check_manifest(docs[0])
    except InvalidManifest as exc:
        raise InvalidManifest(exc.field, exc.problem, source=source) from exc


__all__ = [
    "CHECK_VALUES",
    "MAX_TEMPLATE_BYTES",
    "RUN_PARAMETERS",
    "Manifest",
    "check_manifest",
    "render_template",
]
