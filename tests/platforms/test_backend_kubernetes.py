"""The kubernetes backend against the official client's typed API (no cluster here).

The API object is ``create_autospec(CoreV1Api)``: every call must match the real
method's signature; the request bodies are the client's typed models, and their
serialized form (what the client sends) validates against the Kubernetes schemas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import kubernetes_validate
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from stormwatch.platforms import BackendError
from stormwatch.platforms.kubernetes import COMPLETION_INDEX, KubernetesBackend, pod_ranks

NS = "training"


def _pod(
    name: str,
    index: int,
    node: str | None,
    *,
    job: str = "llm",
    nproc: int = 2,
    phase: str = "Running",
    daemonset: bool = False,
) -> k8s.V1Pod:
    owners = [k8s.V1OwnerReference(api_version="apps/v1", kind="DaemonSet", name="x", uid="u")]
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name=name,
            namespace=NS,
            labels={"stormwatch.io/job": job, COMPLETION_INDEX: str(index)},
            owner_references=owners if daemonset else None,
        ),
        spec=k8s.V1PodSpec(
            node_name=node,
            containers=[
                k8s.V1Container(
                    name="trainer",
                    env=[k8s.V1EnvVar(name="PET_NPROC_PER_NODE", value=str(nproc))],
                )
            ],
        ),
        status=k8s.V1PodStatus(phase=phase),
    )


@pytest.fixture
def api() -> Any:
    core = mock.create_autospec(k8s.CoreV1Api, instance=True)
    pods = [
        _pod("llm-0", 0, "gpu-a"),
        _pod("llm-1", 1, "gpu-b"),
        _pod("llm-old", 1, "gpu-c", phase="Failed"),
    ]
    core.list_namespaced_pod.side_effect = lambda namespace, label_selector: k8s.V1PodList(
        items=[p for p in pods if f"={p.metadata.labels['stormwatch.io/job']}" in label_selector]
    )
    core.list_pod_for_all_namespaces.return_value = k8s.V1PodList(
        items=[
            _pod("llm-1", 1, "gpu-b"),
            _pod("web-1", 0, "gpu-b", job="web"),
            _pod("agent-x", 0, "gpu-b", daemonset=True),
        ]
    )
    core.read_namespaced_pod_log.return_value = "step 10 loss 2.3\n"
    return core


def _backend(api: Any, tmp_path: Path, **extra: Any) -> KubernetesBackend:
    return KubernetesBackend(
        core=api, namespace=NS, diagnostics_dir=tmp_path / "diag", clock=lambda: 50.0, **extra
    )


def _sent(body: Any, api_version: str | None = None, kind: str | None = None) -> dict[str, Any]:
    """What the client puts on the wire for ``body``, checked against the API schema."""
    data = k8s.ApiClient().sanitize_for_serialization(body)
    full = {"apiVersion": api_version, "kind": kind, **data} if kind else data
    kubernetes_validate.validate(full, kubernetes_validate.latest_version(), strict=True)
    return data


def test_ranks_come_from_the_completion_index_and_nproc_per_node(api: Any, tmp_path: Path) -> None:
    assert _backend(api, tmp_path).ranks("llm") == {0: "gpu-a", 1: "gpu-a", 2: "gpu-b", 3: "gpu-b"}
    api.list_namespaced_pod.assert_called_with(NS, label_selector="stormwatch.io/job=llm")


def test_a_pod_without_a_node_rank_is_an_error_naming_the_pod() -> None:
    pod = _pod("odd", 0, "n")
    pod.metadata.labels.pop(COMPLETION_INDEX)
    with pytest.raises(BackendError, match="pod odd: no node rank"):
        pod_ranks(pod)
    pod.spec.containers[0].env.append(k8s.V1EnvVar(name="PET_NODE_RANK", value="3"))
    assert pod_ranks(pod).ranks == (6, 7)


def test_restart_deletes_every_live_pod_of_the_job_with_typed_delete_options(
    api: Any, tmp_path: Path
) -> None:
    detail = _backend(api, tmp_path).restart_workers("llm")
    assert detail == "deleted 2 pods of job llm (llm-0, llm-1)"
    calls = api.delete_namespaced_pod.call_args_list
    assert [c.args for c in calls] == [("llm-0", NS), ("llm-1", NS)]
    body = calls[0].kwargs["body"]
    assert isinstance(body, k8s.V1DeleteOptions)
    # DeleteOptions has no schema of its own in kubernetes-validate: check it inside an Eviction.
    wrapped = k8s.V1Eviction(api_version="policy/v1", kind="Eviction", delete_options=body)
    assert _sent(wrapped)["deleteOptions"] == {
        "gracePeriodSeconds": 30,
        "propagationPolicy": "Background",
    }


def test_exclude_node_cordons_it_then_evicts_only_the_jobs_pods_there(
    api: Any, tmp_path: Path
) -> None:
    detail = _backend(api, tmp_path).exclude_node_and_restart("llm", "gpu-b")
    assert detail == "cordoned gpu-b and evicted the pods of job llm on it (llm-1)"
    (patch,) = api.patch_node.call_args_list
    assert patch.args[0] == "gpu-b" and isinstance(patch.args[1], k8s.V1Node)
    assert _sent(patch.args[1], "v1", "Node") == {"spec": {"unschedulable": True}}
    (evict,) = api.create_namespaced_pod_eviction.call_args_list
    name, namespace, body = evict.args
    assert (name, namespace) == ("llm-1", NS) and isinstance(body, k8s.V1Eviction)
    assert _sent(body)["metadata"] == {"name": "llm-1", "namespace": NS}
    api.delete_namespaced_pod.assert_not_called()
    api.list_pod_for_all_namespaces.assert_not_called()


def test_drain_node_also_evicts_other_pods_but_not_daemonsets(api: Any, tmp_path: Path) -> None:
    detail = _backend(api, tmp_path, drain_node=True).exclude_node_and_restart("llm", "gpu-b")
    assert detail.endswith("; drained 1 other pods")
    evicted = [c.args[:2] for c in api.create_namespaced_pod_eviction.call_args_list]
    assert evicted == [("llm-1", NS), ("web-1", NS)]
    api.list_pod_for_all_namespaces.assert_called_once_with(field_selector="spec.nodeName=gpu-b")


def test_excluding_a_node_the_job_is_not_on_changes_nothing(api: Any, tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="no live worker on node 'gpu-z'"):
        _backend(api, tmp_path).exclude_node_and_restart("llm", "gpu-z")
    api.patch_node.assert_not_called()


def test_an_api_refusal_becomes_a_backend_error_with_the_status(api: Any, tmp_path: Path) -> None:
    api.patch_node.side_effect = ApiException(status=403, reason="Forbidden")
    with pytest.raises(BackendError, match="cordoning node gpu-a failed: 403 Forbidden"):
        _backend(api, tmp_path).exclude_node_and_restart("llm", "gpu-a")
    api.create_namespaced_pod_eviction.assert_not_called()


def test_checkpoint_needs_a_shared_control_dir_and_arms_the_lowest_rank(
    api: Any, tmp_path: Path
) -> None:
    with pytest.raises(BackendError, match="control directory"):
        _backend(api, tmp_path).request_checkpoint("llm")
    backend = _backend(api, tmp_path, control_dir=tmp_path / "control")
    assert "rank0.json" in backend.request_checkpoint("llm")
    assert json.loads((tmp_path / "control" / "rank0.json").read_text()) == {
        "faults": [{"point": "checkpoint_now", "requested_at": 50.0}]
    }


def test_diagnostics_hold_each_pods_state_and_log_tail(api: Any, tmp_path: Path) -> None:
    _backend(api, tmp_path).collect_diagnostics("llm", 9)
    report = json.loads((tmp_path / "diag" / "incident-9.json").read_text())
    assert [(p["pod"], p["node"], p["ranks"]) for p in report["pods"]] == [
        ("llm-0", "gpu-a", [0, 1]),
        ("llm-1", "gpu-b", [2, 3]),
    ]
    assert report["pods"][0]["log_tail"] == "step 10 loss 2.3\n"
    api.read_namespaced_pod_log.assert_any_call("llm-0", NS, tail_lines=200)
