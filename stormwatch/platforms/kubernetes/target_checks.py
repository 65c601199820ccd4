"""What a ``kubernetes`` target file must satisfy beyond its fields' types (called by
:func:`stormwatch.platforms.targets.platform_issues`, so every problem is reported with
the others, before anything is asked of the cluster or created in it):

* the agents' ports are their pods' container ports (``metrics``, ``fault-api``), not
  ``agents.port`` / ``agents.fault_port``;
* a job is attached by name (``job.attach.id`` is a Slurm job id);
* a ``job.submit`` template renders to one valid Job or JobSet
  (:func:`~.manifests.render_template` with :data:`~.manifests.CHECK_VALUES` for the
  run's values): a bad one is refused here, naming the manifest's field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stormwatch.platforms.errors import InvalidManifest, TargetIssue
from stormwatch.platforms.kubernetes.manifests import CHECK_VALUES, render_template

if TYPE_CHECKING:
    from stormwatch.platforms.targets import TargetFile

_PORTS = (
    "only for slurm (kubernetes reads the agent pods' container ports named metrics and "
    "fault-api); remove it"
)


def target_issues(target: TargetFile) -> list[TargetIssue]:
    """The problems of a kubernetes ``target`` (module docstring); empty when none."""
    issues = [
        TargetIssue(f"agents.{name}", _PORTS)
        for name in sorted({"port", "fault_port"} & target.agents.model_fields_set)
    ]
    job = target.job
    if job is not None and job.attach is not None and job.attach.id is not None:
        issues.append(TargetIssue("job.attach.id", "only for slurm; kubernetes attaches by name"))
    if job is not None and job.submit is not None:
        try:
            render_template(job.submit.template, job.submit.parameters, CHECK_VALUES)
        except InvalidManifest as exc:
            template = job.submit.template
            if exc.field == "parameters":
                issues.append(TargetIssue("job.submit.parameters", f"{template}: {exc.problem}"))
            else:
                field = f"{exc.field}: " if exc.field else ""
                issue = TargetIssue("job.submit.template", f"{template}: {field}{exc.problem}")
                issues.append(issue)
    return issues


__all__ = ["target_issues"]
