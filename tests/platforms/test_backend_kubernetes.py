"""The kubernetes backend against recorded API responses (no cluster here).

The backend talks to :class:`RecordedKubeApi`, the same ``KubeApi`` interface as the
official client's adapter, answered from the API JSON bodies in
``recordings/kubernetes/`` (deserialised by the client's own ``ApiClient``); errors
come back as the client's ``ApiException`` with the server's ``Status`` body. The
request bodies the backend sends are the client's typed models, serialised as the
client does and validated against the Kubernetes schemas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client as k8s

from stormwatch.platforms import BackendError, NotStopped
from stormwatch.platforms.kubernetes import (
    COMPLETION_INDEX,
    KubernetesBackend,
    RecordedKubeApi,
    pod_ranks,
)

RECORDINGS = Path(__file__).parent / "recordings" / "kubernetes"
NS = "training"
PODS = f"GET /api/v1/namespaces/{NS}/pods"
JOB = f"GET /apis/batch/v1/namespaces/{NS}/jobs"
JOBSET = f"GET /apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"
CTRL = "batch.kubernetes.io/controller-uid=5f0c2a4e-1b7d-4c1e-9a55-3c2f1e0d9b11"
LLM_PODS = f"{PODS}?labelSelector={CTRL}"


class Clock:
    """Unix time that moves only when the backend sleeps."""

    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def api() -> RecordedKubeApi:
    """Job ``llm`` (indexed, 2 pods x 2 ranks on gpu-a and gpu-b) running in ``training``."""
    recorded = RecordedKubeApi(RECORDINGS)
    recorded.answer(f"{JOB}/llm", "job-llm.json")
    recorded.answer(LLM_PODS, "pods-llm-running.json")
    for pod, log in (("llm-0-x7k2p", "llm-0.log"), ("llm-1-q9z4m", "llm-1.log")):
        recorded.answer(f"{PODS}/{pod}/log?tailLines=200", log)
    recorded.answer(f"GET /api/v1/namespaces/{NS}/events", "events-training.json")
    return recorded


def _backend(api: RecordedKubeApi, tmp_path: Path, **extra: Any) -> KubernetesBackend:
    clock = Clock()
    return KubernetesBackend(
        api=api,
        namespace=NS,
        diagnostics_dir=tmp_path / "diag",
        clock=clock,
        sleep=clock.sleep,
        readback_timeout_s=60,
        **extra,
    )


def _sent(body: Any, api_version: str | None = None, kind: str | None = None) -> dict[str, Any]:
    """What the client put on the wire, checked against the API schema."""
    full = {"apiVersion": api_version, "kind": kind, **body} if kind else body
    kubernetes_validate.validate(full, kubernetes_validate.latest_version(), strict=True)
    return dict(body)


def test_ranks_come_from_the_completion_index_and_nproc_per_node(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    assert _backend(api, tmp_path).ranks("llm") == {0: "gpu-a", 1: "gpu-a", 2: "gpu-b", 3: "gpu-b"}
    # the Job's own selector finds its pods; the Failed pod of an earlier try is not a worker
    assert api.requests("GET") == [f"{JOB}/llm", LLM_PODS]


def test_a_jobset_places_node_rank_by_global_job_index_and_completion_index(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer(f"{JOB}/pt", "status-404-job-pt.json")
    api.answer(f"{JOBSET}/pt", "jobset-pt.json")
    api.answer(f"{PODS}?labelSelector=jobset.sigs.k8s.io/jobset-name=pt", "pods-jobset-pt.json")
    placement = _backend(api, tmp_path).ranks("pt")
    assert placement == {
        **dict.fromkeys((0, 1), "gpu-a"),
        **dict.fromkeys((2, 3), "gpu-b"),
        **dict.fromkeys((4, 5), "gpu-c"),
        **dict.fromkeys((6, 7), "gpu-d"),
    }


def test_pods_by_label_when_neither_job_nor_jobset_exists(tmp_path: Path) -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer(f"{JOB}/llm", "status-404-job-llm.json")
    api.answer(f"{JOBSET}/llm", "status-404-no-jobset-crd.json")
    api.answer(f"{PODS}?labelSelector=stormwatch.io/job=llm", "pods-llm-running.json")
    assert _backend(api, tmp_path).ranks("llm")[3] == "gpu-b"


def test_a_missing_job_is_an_error_naming_where_it_looked(tmp_path: Path) -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer(f"{JOB}/llm", "status-404-job-llm.json")
    api.answer(f"{JOBSET}/llm", "status-404-jobset-llm.json")
    api.answer(f"{PODS}?labelSelector=stormwatch.io/job=llm", "pods-llm-none.json")
    with pytest.raises(BackendError, match=r"no live worker of job 'llm' found.*stormwatch.io/job"):
        _backend(api, tmp_path).restart_workers("llm")
    with pytest.raises(BackendError, match="reading Job training/llm failed: 404 NotFound"):
        _backend(api, tmp_path, workload="Job").ranks("llm")
    assert api.requests("DELETE") == []


def test_a_pod_without_a_node_rank_is_an_error_naming_the_pod() -> None:
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="odd", labels={}),
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(name="t", env=[k8s.V1EnvVar(name="PET_NPROC_PER_NODE", value="2")])
            ]
        ),
    )
    with pytest.raises(BackendError, match="pod odd: no node rank"):
        pod_ranks(pod)
    pod.spec.containers[0].env.append(k8s.V1EnvVar(name="PET_NODE_RANK", value="3"))
    assert pod_ranks(pod).ranks == (6, 7)
    pod.metadata.labels[COMPLETION_INDEX] = "1"
    assert pod_ranks(pod).ranks == (2, 3)


def test_restart_deletes_every_live_pod_and_reads_back_new_uids_running(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer(
        LLM_PODS, "pods-llm-running.json", "pods-llm-restarting.json", "pods-llm-replaced.json"
    )
    api.answer(f"DELETE /api/v1/namespaces/{NS}/pods/llm-0-x7k2p", "pod-llm-0-deleting.json")
    api.answer(f"DELETE /api/v1/namespaces/{NS}/pods/llm-1-q9z4m", "pod-llm-1-deleting.json")
    detail = _backend(api, tmp_path).restart_workers("llm")
    assert detail == (
        "deleted 2 pods of job llm (llm-0-x7k2p, llm-1-q9z4m); "
        "2 new pods Running (llm-0-m3n4b, llm-1-v5c6x)"
    )
    deletes = [(line, body) for line, body in api.calls if line.startswith("DELETE")]
    assert [line.rsplit("/", 1)[1] for line, _ in deletes] == ["llm-0-x7k2p", "llm-1-q9z4m"]
    # DeleteOptions has no schema of its own in kubernetes-validate: check it inside an Eviction.
    wrapped = {"apiVersion": "policy/v1", "kind": "Eviction", "deleteOptions": deletes[0][1]}
    assert _sent(wrapped)["deleteOptions"] == {
        "gracePeriodSeconds": 30,
        "propagationPolicy": "Background",
    }
    assert api.requests("GET").count(LLM_PODS) == 3  # found, then read back twice


def _deletes(api: RecordedKubeApi) -> None:
    api.answer(f"DELETE /api/v1/namespaces/{NS}/pods/llm-0-x7k2p", "pod-llm-0-deleting.json")
    api.answer(f"DELETE /api/v1/namespaces/{NS}/pods/llm-1-q9z4m", "pod-llm-1-deleting.json")


def test_restart_answers_only_once_the_deleted_pods_are_gone_not_while_one_terminates(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    # The replacements run while the old llm-0 is still terminating (its rank blocked in a
    # collective, SIGTERM not handled): its processes may still run until the kubelet's
    # SIGKILL at the grace period; only the next read finds it gone.
    api.answer(
        LLM_PODS,
        "pods-llm-running.json",
        "pods-llm-replaced-old-terminating.json",
        "pods-llm-replaced.json",
    )
    _deletes(api)
    backend = _backend(api, tmp_path, grace_period_s=10)
    detail = backend.restart_workers("llm")
    assert detail.endswith("2 new pods Running (llm-0-m3n4b, llm-1-v5c6x)")
    assert api.requests("GET").count(LLM_PODS) == 3  # found; old one terminating; gone
    deletes = [body for line, body in api.calls if line.startswith("DELETE")]
    assert all(body["gracePeriodSeconds"] == 10 for body in deletes)


def test_a_deleted_pod_still_running_after_the_grace_period_is_not_stopped(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer(LLM_PODS, "pods-llm-running.json", "pods-llm-replaced-old-terminating.json")
    _deletes(api)
    backend = _backend(api, tmp_path, grace_period_s=10)
    with pytest.raises(NotStopped) as caught:
        backend.restart_workers("llm")
    message = str(caught.value)
    assert message.startswith(
        "deleted 2 pods of job llm (llm-0-x7k2p, llm-1-q9z4m), but after 70 s"
    )
    assert "SIGKILL 10 s after SIGTERM" in message
    assert "llm-0-x7k2p (uid 0a1e0b5c, Running, node gpu-a)" in message
    assert "llm-0-m3n4b" not in message  # a replacement is not what failed to stop
    assert backend.clock() >= 50.0 + 70  # waited out the grace period and its margin


def test_restart_whose_replacements_never_run_says_what_it_saw(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer(LLM_PODS, "pods-llm-running.json", "pods-llm-stuck-pending.json")
    api.answer(f"DELETE /api/v1/namespaces/{NS}/pods/llm-0-x7k2p", "pod-llm-0-deleting.json")
    api.answer(f"DELETE /api/v1/namespaces/{NS}/pods/llm-1-q9z4m", "pod-llm-1-deleting.json")
    with pytest.raises(BackendError) as caught:
        _backend(api, tmp_path).restart_workers("llm")
    assert "deleted 2 pods of job llm" in str(caught.value)
    assert "after 60 s Job llm in namespace training does not have 2 new Running pods" in str(
        caught.value
    )
    assert "llm-0-m3n4b (uid 9b7c4e21, Pending, node None)" in str(caught.value)


def test_a_forbidden_delete_names_the_missing_rbac_verb(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer(f"DELETE /api/v1/namespaces/{NS}/pods/llm-0-x7k2p", "status-403-delete-pods.json")
    with pytest.raises(BackendError) as caught:
        _backend(api, tmp_path).restart_workers("llm")
    message = str(caught.value)
    assert "deleting pod training/llm-0-x7k2p failed: 403 Forbidden" in message
    assert "needs RBAC verb 'delete' on 'pods' (API group core) in namespace training" in message
    assert 'cannot delete resource "pods"' in message  # what the server said


def test_exclude_node_cordons_it_then_evicts_only_the_jobs_pods_there(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer(LLM_PODS, "pods-llm-running.json", "pods-llm-rescheduled.json")
    api.answer("PATCH /api/v1/nodes/gpu-b", "node-gpu-b-cordoned.json")
    api.answer("GET /api/v1/nodes/gpu-b", "node-gpu-b-cordoned.json")
    evict = f"POST /api/v1/namespaces/{NS}/pods/llm-1-q9z4m/eviction"
    api.answer(evict, "status-201-eviction.json")
    detail = _backend(api, tmp_path).exclude_node_and_restart("llm", "gpu-b")
    assert detail == (
        "cordoned gpu-b and evicted the pods of job llm on it (llm-1-q9z4m); "
        "2 pods Running, none on gpu-b (nodes gpu-a, gpu-c)"
    )
    bodies = dict(api.calls)
    assert _sent(bodies["PATCH /api/v1/nodes/gpu-b"], "v1", "Node") == {
        "spec": {"unschedulable": True}
    }
    assert _sent(bodies[evict])["metadata"] == {"name": "llm-1-q9z4m", "namespace": NS}
    assert [line.split()[0] for line, _ in api.calls].count("DELETE") == 0
    assert not any(line.startswith("GET /api/v1/pods") for line in api.requests())


def test_exclude_fails_when_a_replacement_lands_on_the_excluded_node(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer(LLM_PODS, "pods-llm-running.json", "pods-llm-back-on-node.json")
    api.answer("PATCH /api/v1/nodes/gpu-b", "node-gpu-b-cordoned.json")
    api.answer("GET /api/v1/nodes/gpu-b", "node-gpu-b-cordoned.json")
    api.answer(
        f"POST /api/v1/namespaces/{NS}/pods/llm-1-q9z4m/eviction", "status-201-eviction.json"
    )
    with pytest.raises(BackendError, match=r"none on gpu-b: seen .*llm-1-v5c6x .*node gpu-b\)"):
        _backend(api, tmp_path).exclude_node_and_restart("llm", "gpu-b")


def test_a_node_that_reads_back_schedulable_is_an_error(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer("PATCH /api/v1/nodes/gpu-b", "node-gpu-b.json")
    api.answer("GET /api/v1/nodes/gpu-b", "node-gpu-b.json")
    with pytest.raises(BackendError, match="cordoned node gpu-b, but it reads back schedulable"):
        _backend(api, tmp_path).exclude_node_and_restart("llm", "gpu-b")
    assert api.requests("POST") == []


def test_a_disruption_budget_refusing_the_eviction_is_a_clear_error(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer("PATCH /api/v1/nodes/gpu-b", "node-gpu-b-cordoned.json")
    api.answer("GET /api/v1/nodes/gpu-b", "node-gpu-b-cordoned.json")
    api.answer(f"POST /api/v1/namespaces/{NS}/pods/llm-1-q9z4m/eviction", "status-429-pdb.json")
    with pytest.raises(BackendError) as caught:
        _backend(api, tmp_path).exclude_node_and_restart("llm", "gpu-b")
    message = str(caught.value)
    assert "evicting pod training/llm-1-q9z4m failed: 429 TooManyRequests" in message
    assert "a PodDisruptionBudget refuses the eviction" in message
    assert "The disruption budget llm-pdb needs 2 healthy pods and has 2 currently" in message
    assert "node gpu-b stays cordoned (kubectl uncordon gpu-b to undo)" in message


def test_drain_node_also_evicts_other_pods_but_not_daemonsets(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer(LLM_PODS, "pods-llm-running.json", "pods-llm-rescheduled.json")
    api.answer("PATCH /api/v1/nodes/gpu-b", "node-gpu-b-cordoned.json")
    api.answer("GET /api/v1/nodes/gpu-b", "node-gpu-b-cordoned.json")
    api.answer("GET /api/v1/pods?fieldSelector=spec.nodeName=gpu-b", "pods-on-gpu-b.json")
    for pod in ("llm-1-q9z4m", "web-5"):
        api.answer(f"POST /api/v1/namespaces/{NS}/pods/{pod}/eviction", "status-201-eviction.json")
    detail = _backend(api, tmp_path, drain_node=True).exclude_node_and_restart("llm", "gpu-b")
    assert "; drained 1 other pods;" in detail
    assert [line.split("/")[-2] for line in api.requests("POST")] == ["llm-1-q9z4m", "web-5"]


def test_excluding_a_node_the_job_is_not_on_changes_nothing(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    with pytest.raises(BackendError, match="no live worker on node 'gpu-z'"):
        _backend(api, tmp_path).exclude_node_and_restart("llm", "gpu-z")
    assert api.requests("PATCH") == []


def test_a_forbidden_cordon_names_the_missing_rbac_verb_and_evicts_nothing(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    api.answer("PATCH /api/v1/nodes/gpu-a", "status-403-patch-node.json")
    with pytest.raises(BackendError) as caught:
        _backend(api, tmp_path).exclude_node_and_restart("llm", "gpu-a")
    message = str(caught.value)
    assert "cordoning node gpu-a failed: 403 Forbidden" in message
    assert "needs RBAC verb 'patch' on 'nodes' (API group core) cluster-wide" in message
    assert api.requests("POST") == []


def test_checkpoint_needs_a_shared_control_dir_and_arms_the_lowest_rank(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    with pytest.raises(BackendError, match="control directory"):
        _backend(api, tmp_path).request_checkpoint("llm")
    backend = _backend(api, tmp_path, control_dir=tmp_path / "control")
    assert "rank0.json" in backend.request_checkpoint("llm")
    assert json.loads((tmp_path / "control" / "rank0.json").read_text()) == {
        "faults": [{"point": "checkpoint_now", "requested_at": 50.0}]
    }


def test_diagnostics_hold_each_pods_state_log_tail_and_the_jobs_events(
    api: RecordedKubeApi, tmp_path: Path
) -> None:
    _backend(api, tmp_path).collect_diagnostics("llm", 9)
    report = json.loads((tmp_path / "diag" / "incident-9.json").read_text())
    assert [(p["pod"], p["node"], p["ranks"]) for p in report["pods"]] == [
        ("llm-0-x7k2p", "gpu-a", [0, 1]),
        ("llm-1-q9z4m", "gpu-b", [2, 3]),
    ]
    assert report["pods"][0]["log_tail"] == "step 120 loss 2.31\nstep 121 loss 2.30\n"
    assert report["workload"] == {"kind": "Job", "name": "llm"}
    assert [(e["object"], e["reason"]) for e in report["events"]] == [
        ("Job/llm", "SuccessfulCreate"),
        ("Pod/llm-1-q9z4m", "Started"),
    ]
