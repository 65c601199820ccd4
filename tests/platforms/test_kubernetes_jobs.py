"""Starting, attaching to, reading the outcome of and deleting a job (Job, indexed Job,
JobSet), checking its manifest, and finding the node agents, against recorded responses."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from stormwatch.platforms import AgentEndpoint, BackendError, InvalidManifest
from stormwatch.platforms.kubernetes import (
    RecordedKubeApi,
    Workload,
    delete_workload,
    discover_agents,
    find_workload,
    read_outcome,
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
    assert agents["gpu-b"] == AgentEndpoint(
        node="gpu-b", url="http://10.244.2.5:9400", pod="stormwatch/stormwatch-agent-8mz2q"
    )
    assert agents["gpu-b"].fault_api == "http://10.244.2.5:9400"  # no fault API port: the same


def test_host_network_agents_give_their_fault_api_port_as_the_fault_url() -> None:
    """The dev overlay: agents on the host network, ports named metrics and fault-api."""
    request = AGENTS.replace("/stormwatch/", "/stormwatch-dev/")
    api = RecordedKubeApi(RECORDINGS).answer(request, "pods-agents-dev.json")
    agents = discover_agents(api, namespace="stormwatch-dev", scheme="https")
    assert agents["gpu-a"].url == "https://10.0.0.11:9402"
    assert agents["gpu-a"].fault_api == "https://10.0.0.11:9403"


def test_agent_discovery_refused_names_the_rbac_verb() -> None:
    api = RecordedKubeApi(RECORDINGS).answer(AGENTS, "status-403-list-pods-stormwatch.json")
    with pytest.raises(BackendError, match=r"'list' on 'pods' .* in namespace stormwatch"):
        discover_agents(api)


def test_starting_the_example_job_sends_a_valid_job_and_attaches_by_its_selector(
    kube_validate: Callable[[dict[str, Any]], None],
) -> None:
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
    kube_validate(sent)


def test_a_manifest_with_an_unknown_field_is_refused_before_any_call() -> None:
    api = RecordedKubeApi(RECORDINGS)
    manifest = _example_job()
    manifest["spec"]["completion"] = 2  # type: ignore[index]
    with pytest.raises(InvalidManifest, match=r"spec.completion: Extra inputs.*batch/v1 Job"):
        start_job(api, "training", manifest)
    with pytest.raises(InvalidManifest, match="kind: 'Deployment' is not Job or JobSet"):
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
def test_every_recorded_body_is_a_valid_api_object(
    name: str, kube_validate: Callable[[dict[str, Any]], None]
) -> None:
    """The recordings are API bodies as the server sends them: they validate strictly (a
    JobSet against the JobSet CRD's schema, tests/schemas/)."""
    body = json.loads((RECORDINGS / name).read_text())
    if body.get("kind") == "Status":  # no schema in kubernetes-validate: the client's model
        assert body["apiVersion"] == "v1"
        assert k8s.V1Status.model_validate(body).status in ("Success", "Failure")
        return
    kube_validate(body)


JOB = "GET /apis/batch/v1/namespaces/training/jobs"
JOBSET = "GET /apis/jobset.x-k8s.io/v1alpha2/namespaces/training/jobsets"
JOBS_DELETE = "DELETE /apis/batch/v1/namespaces/training/jobs"
JOBSETS_DELETE = "DELETE /apis/jobset.x-k8s.io/v1alpha2/namespaces/training/jobsets"


@pytest.mark.parametrize(
    ("kind", "name", "recording", "outcome"),
    [
        ("Job", "llm", "job-llm.json", None),  # indexed Job, running
        ("Job", "llm", "job-llm-complete.json", True),
        ("Job", "llm", "job-llm-failing.json", None),  # FailureTarget: pods still terminating
        ("Job", "llm", "job-llm-failed.json", False),
        ("Job", "solo", "job-solo.json", None),  # a Job that is not indexed
        ("Job", "solo", "job-solo-complete.json", True),
        ("Job", "solo", "job-solo-failed.json", False),
        ("JobSet", "pt", "jobset-pt.json", None),
        ("JobSet", "pt", "jobset-pt-completed.json", True),
        ("JobSet", "pt", "jobset-pt-failed.json", False),
    ],
)
def test_the_outcome_is_the_workloads_terminal_status_condition(
    kind: str, name: str, recording: str, outcome: bool | None
) -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer(f"{JOB if kind == 'Job' else JOBSET}/{name}", recording)
    workload = Workload(kind, name, "training", "unused")  # type: ignore[arg-type]
    assert read_outcome(api, workload) is outcome


def test_pods_by_label_have_no_outcome_and_nothing_is_asked() -> None:
    api = RecordedKubeApi(RECORDINGS)
    assert read_outcome(api, Workload("label", "llm", "training", "stormwatch.io/job=llm")) is None
    assert api.calls == []


def test_the_outcome_of_a_job_that_is_gone_is_an_error_saying_so() -> None:
    api = RecordedKubeApi(RECORDINGS).answer(f"{JOB}/llm", "status-404-job-llm.json")
    with pytest.raises(BackendError, match="reading the status of Job training/llm failed: 404"):
        read_outcome(api, Workload("Job", "llm", "training", "unused"))


@pytest.mark.parametrize(
    ("kind", "request_line", "recording"),
    [
        ("Job", f"{JOBS_DELETE}/llm-run", "status-200-job-llm-run-deleted.json"),
        ("JobSet", f"{JOBSETS_DELETE}/pt-run", "status-200-jobset-pt-run-deleted.json"),
        ("Job", f"{JOBS_DELETE}/llm-run", "status-404-job-llm.json"),  # gone already: fine
    ],
)
def test_deleting_a_workload_takes_its_pods_with_it_in_the_background(
    kind: str, request_line: str, recording: str
) -> None:
    api = RecordedKubeApi(RECORDINGS).answer(request_line, recording)
    name = request_line.rsplit("/", 1)[1]
    delete_workload(api, Workload(kind, name, "training", "unused"), grace_period_s=30)  # type: ignore[arg-type]
    assert api.calls == [
        (request_line, {"gracePeriodSeconds": 30, "propagationPolicy": "Background"})
    ]


def test_pods_by_label_cannot_be_deleted_as_a_workload() -> None:
    api = RecordedKubeApi(RECORDINGS)
    with pytest.raises(BackendError, match="no Job or JobSet owns them"):
        delete_workload(api, Workload("label", "x", "training", "a=b"), grace_period_s=30)
    assert api.calls == []
