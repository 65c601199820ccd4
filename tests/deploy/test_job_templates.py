"""The job templates a kubernetes target file submits (examples/templates/), once their
placeholders are filled, and their prerequisites, validate strictly against the schemas:
the Job against the Kubernetes OpenAPI schemas, the JobSet against the JobSet CRD's
(tests/schemas/). And every YAML file under deploy/kubernetes is validated by some test."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from stormwatch.platforms.kubernetes import (
    CHECK_VALUES,
    LAUNCHER_ACCESS,
    TARGET_ACCESS,
    render_template,
)

Validate = Callable[[dict[str, Any]], None]
IMAGE = {"IMAGE": "registry.example/stormwatch:1"}


def _template_files(kit: Any) -> list[Path]:
    return sorted((kit.kubernetes / "examples" / "templates").glob("*.yaml"))


def _filled(kit: Any, path: Path) -> list[dict[str, Any]]:
    if "${" not in path.read_text():
        return kit.load_objects(path.read_text())
    return [render_template(path, IMAGE, CHECK_VALUES).body]


def test_the_templates_are_the_ones_tested(kit: Any) -> None:
    names = [p.name for p in _template_files(kit)]
    assert names == TEMPLATES


TEMPLATES = ["chaos-rbac.yaml", "prerequisites.yaml", "training-job.yaml", "training-jobset.yaml"]


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_template_filled_validates_against_its_schema(
    kit: Any, kube_validate: Validate, name: str
) -> None:
    objects = _filled(kit, kit.kubernetes / "examples" / "templates" / name)
    assert objects
    for obj in objects:
        kube_validate(obj)


def test_a_jobset_schema_violation_is_caught(kit: Any, kube_validate: Validate) -> None:
    (jobset,) = _filled(kit, kit.kubernetes / "examples" / "templates" / "training-jobset.yaml")
    typo = copy.deepcopy(jobset)
    typo["spec"]["replicatedJobs"][0]["replica"] = typo["spec"]["replicatedJobs"][0].pop("replicas")
    with pytest.raises(jsonschema.ValidationError, match="'replica' was unexpected"):
        kube_validate(typo)
    deep = copy.deepcopy(jobset)
    pod = deep["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["hostPid"] = True  # hostPID, misspelt, inside the embedded pod template
    with pytest.raises(jsonschema.ValidationError, match="'hostPid' was unexpected"):
        kube_validate(deep)
    wrong_type = copy.deepcopy(jobset)
    wrong_type["spec"]["failurePolicy"]["maxRestarts"] = "three"
    with pytest.raises(jsonschema.ValidationError):
        kube_validate(wrong_type)


def test_a_job_template_schema_violation_is_caught(kit: Any, kube_validate: Validate) -> None:
    (job,) = _filled(kit, kit.kubernetes / "examples" / "templates" / "training-job.yaml")
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kube_validate(job)


def test_the_chaos_role_grants_exactly_what_a_target_reads_and_launches(kit: Any) -> None:
    (role,) = kit.load_objects((kit.kubernetes / "examples/templates/chaos-rbac.yaml").read_text())
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("", "pods", "list"),
        ("batch", "jobs", "get"),
        ("batch", "jobs", "create"),
        ("batch", "jobs", "delete"),
        ("jobset.x-k8s.io", "jobsets", "get"),
        ("jobset.x-k8s.io", "jobsets", "create"),
        ("jobset.x-k8s.io", "jobsets", "delete"),
    }
    assert granted == {(a.group, a.resource, a.verb) for a in (*TARGET_ACCESS, *LAUNCHER_ACCESS)}


#: Folders under deploy/kubernetes and the test that validates what is in them.
VALIDATED = {
    "base": "test_manifests_validate.py (kubectl kustomize, every object)",
    "overlays/dev": "test_manifests_validate.py (kubectl kustomize, every object)",
    "overlays/production": "test_manifests_validate.py (kubectl kustomize, every object)",
    "examples/training-job": "test_manifests_validate.py (kubectl kustomize, every object)",
    "components/dcgm-exporter": "test_manifests_validate.py (composed with production)",
    "examples/templates": "this module (filled, every object)",
    "helm/stormwatch": "test_helm_chart.py (Chart.yaml, values.yaml)",
    "helm/stormwatch/templates": "test_helm_chart.py (rendered, every object)",
    ".": "target.yaml, a target file: tests/platforms/test_kubernetes_target.py",
}


def test_every_yaml_file_under_deploy_kubernetes_is_validated_by_a_test(kit: Any) -> None:
    folders = {str(p.parent.relative_to(kit.kubernetes)) for p in kit.kubernetes.rglob("*.yaml")}
    assert folders - set(VALIDATED) == set(), "validate these folders' manifests in a test"
