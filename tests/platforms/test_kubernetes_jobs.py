"""Starting or attaching to a job, and finding the node agents, against recorded responses."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from stormwatch.platforms import BackendError
from stormwatch.platforms.kubernetes import (
    RecordedKubeApi,
    Workload,
    discover_agents,
    find_workload,
    start_job,
)

RECORDINGS = Path(__file__).parent / "recordings" / "kubernetes"
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "kubernetes" / "examples" / "training-job" / "training-job.yaml"
AGENTS = (
    "GET /api/v1/namespaces/stormwatch/pods?labelSelector=app.kubernetes.io/name=stormwatch-agent"
)


def _example_job() -> dict[str, object]:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    return next(d for d in docs if d["kind"] == "Job")


def test_agents_are_the_ready_pods_of_the_daemonset_by_node() -> None:
    api = RecordedKubeApi(RECORDINGS).answer(AGENTS, "pods-agents.json")
    agents = discover_agents(api)
    assert sorted(agents) == ["gpu-a", "gpu-b"]  # gpu-c's agent is not Ready
    assert agents["gpu-b"].pod == "stormwatch-agent-8mz2q"
    assert agents["gpu-b"].url == "http://10.244.2.5:9400"


def test_agent_discovery_refused_names_the_rbac_verb() -> None:
    api = RecordedKubeApi(RECORDINGS).answer(AGENTS, "status-403-list-pods-stormwatch.json")
    with pytest.raises(BackendError, match=r"'list' on 'pods' .* in namespace stormwatch"):
        discover_agents(api)


def test_starting_the_example_job_sends_a_valid_job_and_attaches_by_its_selector() -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer("POST /apis/batch/v1/namespaces/training/jobs", "job-llm.json")
    manifest = _example_job()
    workload = start_job(api, "training", manifest)
    assert workload == Workload(
        "Job",
        "train-demo",
        "training",
        "batch.kubernetes.io/controller-uid=5f0c2a4e-1b7d-4c1e-9a55-3c2f1e0d9b11",
    )
    ((_, sent),) = api.calls
    assert sent == manifest  # the client sends the manifest unchanged
    kubernetes_validate.validate(sent, kubernetes_validate.latest_version(), strict=True)


def test_a_manifest_with_an_unknown_field_is_refused_before_any_call() -> None:
    api = RecordedKubeApi(RECORDINGS)
    manifest = _example_job()
    manifest["spec"]["completion"] = 2  # type: ignore[index]
    with pytest.raises(BackendError, match=r"not a valid batch/v1 Job.*spec.completion"):
        start_job(api, "training", manifest)
    with pytest.raises(BackendError, match="kind 'Deployment' is not Job or JobSet"):
        start_job(api, "training", {"kind": "Deployment", "metadata": {"name": "x"}})
    assert api.calls == []


def test_starting_a_job_that_exists_is_a_clear_error() -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer("POST /apis/batch/v1/namespaces/training/jobs", "status-409-job-exists.json")
    with pytest.raises(BackendError, match="creating Job training/train-demo failed: 409"):
        start_job(api, "training", _example_job())


def test_starting_a_jobset_posts_it_to_the_jobset_api() -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer("POST /apis/jobset.x-k8s.io/v1alpha2/namespaces/training/jobsets", "jobset-pt.json")
    manifest = json.loads((RECORDINGS / "jobset-pt.json").read_text())
    del manifest["status"]
    workload = start_job(api, "training", manifest)
    assert workload == Workload("JobSet", "pt", "training", "jobset.sigs.k8s.io/jobset-name=pt", 2)


def test_attaching_by_name_finds_a_running_job() -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer("GET /apis/batch/v1/namespaces/training/jobs/llm", "job-llm.json")
    workload = find_workload(api, "llm", "training", job_label="stormwatch.io/job")
    assert workload.kind == "Job" and workload.selector.startswith("batch.kubernetes.io/")


@pytest.mark.parametrize("name", sorted(p.name for p in RECORDINGS.glob("*.json")))
def test_every_recorded_body_is_a_valid_api_object(name: str) -> None:
    """The recordings are API bodies as the server sends them: they validate strictly."""
    body = json.loads((RECORDINGS / name).read_text())
    if body.get("kind") in ("Status", "JobSet"):  # no schema in kubernetes-validate
        assert body["apiVersion"] in ("v1", "jobset.x-k8s.io/v1alpha2")
        return
    kubernetes_validate.validate(body, kubernetes_validate.latest_version(), strict=True)
