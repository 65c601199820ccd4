"""Job templates (a kubernetes target file's ``job.submit``): placeholders filled, one Job or
JobSet checked before anything is sent, each bad template one error naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormwatch.platforms import InvalidManifest
from stormwatch.platforms.kubernetes import CHECK_VALUES, check_manifest, render_template

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "deploy" / "kubernetes" / "examples" / "templates"
RUN = {"STORMWATCH_JOB": "llm-run", "STORMWATCH_STEPS": "100", "STORMWATCH_CHECKPOINT_EVERY": "10"}
IMAGE = {"IMAGE": "registry.example/stormwatch:1"}

JOB = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: ${STORMWATCH_JOB}
spec:
  completionMode: Indexed
  completions: 4
  parallelism: 4
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: trainer
        image: ${IMAGE}
        args: ["--node=$(NODE_NAME)", "--steps=${STORMWATCH_STEPS}", "--note=$${KEEP}"]
        env:
        - {name: PET_NPROC_PER_NODE, value: "8"}
"""


def _template(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_placeholders_are_filled_and_kubernetes_expansion_is_left_alone(tmp_path: Path) -> None:
    manifest = render_template(_template(tmp_path, JOB), IMAGE, RUN)
    assert (manifest.kind, manifest.name, manifest.world_size) == ("Job", "llm-run", 32)
    (container,) = manifest.body["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/stormwatch:1"
    assert container["args"] == ["--node=$(NODE_NAME)", "--steps=100", "--note=${KEEP}"]


@pytest.mark.parametrize(
    ("name", "world_size"), [("training-job.yaml", 16), ("training-jobset.yaml", 16)]
)
def test_the_shipped_templates_render_with_their_world_size(name: str, world_size: int) -> None:
    manifest = render_template(TEMPLATES / name, IMAGE, CHECK_VALUES)
    assert manifest.name == "stormwatch-check"
    assert manifest.world_size == world_size  # 2 pods x PET_NPROC_PER_NODE 8


def test_a_jobset_counts_the_ranks_of_every_replicated_job() -> None:
    pod = {"spec": {"containers": [{"name": "trainer"}]}}
    job = {"spec": {"parallelism": 2, "template": pod}}
    manifest = check_manifest(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "pt"},
            "spec": {
                "replicatedJobs": [
                    {"name": "driver", "template": {"spec": {"template": pod}}},
                    {"name": "workers", "replicas": 3, "template": job},
                ]
            },
        }
    )
    assert manifest.world_size == 1 + 3 * 2


#: (what is wrong, the template text, the field the error names, what it says)
BAD = [
    ("not YAML", "kind: Job\n  metadata: [", "", "not YAML"),
    ("a list", "- kind: Job\n", "", "must be a mapping"),
    ("two documents", f"{JOB}---\nkind: Service\n", "", "holds 2 documents (Job, Service)"),
    ("no document", "# nothing\n", "", "holds 0 documents"),
    ("wrong kind", JOB.replace("kind: Job", "kind: Deployment"), "kind", "is not Job or JobSet"),
    ("wrong apiVersion", JOB.replace("batch/v1", "batch/v1beta1"), "apiVersion", "batch/v1"),
    ("no name", JOB.replace("  name: ${STORMWATCH_JOB}\n", ""), "metadata.name", "required"),
    ("a bad name", JOB.replace("${STORMWATCH_JOB}", "LLM_run", 1), "metadata.name", "DNS label"),
    (
        "an unknown field",
        JOB.replace("completions:", "completion:"),
        "spec.completion",
        "Extra inputs",
    ),
    (
        "a wrong type",
        JOB.replace("parallelism: 4", "parallelism: four"),
        "spec.parallelism",
        "valid integer",
    ),
    (
        "ranks per pod not a number",
        JOB.replace('value: "8"', 'value: "eight"'),
        "spec.template.spec.containers[0].env[PET_NPROC_PER_NODE]",
        "not a positive integer",
    ),
    ("a placeholder nobody fills", JOB.replace("${IMAGE}", "${IMAGES}"), "parameters", "IMAGES"),
]


@pytest.mark.parametrize(("case", "text", "field", "says"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_template_is_one_error_naming_the_field(
    tmp_path: Path, case: str, text: str, field: str, says: str
) -> None:
    with pytest.raises(InvalidManifest) as raised:
        render_template(_template(tmp_path, text), IMAGE, RUN)
    assert raised.value.field == field, case
    assert says in str(raised.value)
    assert str(raised.value).startswith(f"{tmp_path / 'job.yaml'}: ")  # names the template


TYPO_JOB_SPEC = {"parallelizm": 2, "template": {"spec": {"containers": [{"name": "trainer"}]}}}
JOBSET = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "pt"}}
BAD_JOBSETS = [
    ("no replicated jobs", {"spec": {}}, "spec.replicatedJobs", "required"),
    (
        "a typo in a replicated job",
        {"spec": {"replicatedJobs": [{"name": "w", "replica": 2, "template": {}}]}},
        "spec.replicatedJobs[0].replica",
        "unknown field",
    ),
    (
        "a replicated job without a name",
        {"spec": {"replicatedJobs": [{"template": {}}]}},
        "spec.replicatedJobs[0].name",
        "required",
    ),
    (
        "an invalid job template",
        {"spec": {"replicatedJobs": [{"name": "w", "template": {"spec": TYPO_JOB_SPEC}}]}},
        "spec.replicatedJobs[0].template.spec.parallelizm",
        "Extra inputs",
    ),
]


@pytest.mark.parametrize(
    ("case", "extra", "field", "says"), BAD_JOBSETS, ids=[b[0] for b in BAD_JOBSETS]
)
def test_a_bad_jobset_is_one_error_naming_the_field(
    case: str, extra: dict[str, object], field: str, says: str
) -> None:
    with pytest.raises(InvalidManifest) as raised:
        check_manifest({**JOBSET, **extra})
    assert raised.value.field == field, case
    assert says in str(raised.value)


def test_a_parameter_may_not_take_a_run_parameters_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidManifest, match="STORMWATCH_JOB is filled by the run") as raised:
        render_template(_template(tmp_path, JOB), {"STORMWATCH_JOB": "x", **IMAGE}, RUN)
    assert raised.value.field == "parameters"
