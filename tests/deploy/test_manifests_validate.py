"""Every overlay renders with ``kubectl kustomize`` and every object in it validates.

Built-in kinds: ``kubernetes-validate`` against the OpenAPI schemas of its newest
Kubernetes release, strict (unknown fields fail). Prometheus Operator kinds
(ServiceMonitor, PrometheusRule, AlertmanagerConfig), which kubernetes-validate has
no schema for: the pydantic models generated from the operator's published CRD
schemas (``cloudcoil-models-prometheus-operator``); a field those models do not know
would be dropped, so the object must come back unchanged from a validate-dump round trip.
"""

from __future__ import annotations

import copy
import os
import posixpath
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client as k8s

from stormwatch.agent.cli import run as agent_run
from stormwatch.agent.kube.podresources import DEFAULT_SOCKET
from stormwatch.platforms.kubernetes import COMPLETION_INDEX, RESPONDER_ACCESS

FOLDERS = ["base", "examples/training-job", *(f"overlays/{o}" for o in ("dev", "production"))]


@pytest.fixture(scope="module")
def rendered(kit: Any) -> dict[str, list[dict[str, Any]]]:
    return {folder: kit.kustomize(kit.kubernetes / folder) for folder in FOLDERS}


def test_the_overlays_are_the_ones_tested(kit: Any) -> None:
    assert kit.overlays == ["dev", "production"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_object_validates_against_its_schema(
    folder: str, rendered: dict[str, list[dict[str, Any]]], kit: Any
) -> None:
    objects = rendered[folder]
    assert objects
    for obj in objects:
        kit.validate(obj)


def test_a_schema_violation_is_caught(rendered: dict[str, list[dict[str, Any]]], kit: Any) -> None:
    base = copy.deepcopy(rendered["base"])  # the fixture is shared by the module
    monitor = next(o for o in base if o["kind"] == "ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0]
    endpoint["honorLabel"] = endpoint.pop("honorLabels")  # a typo
    with pytest.raises(AssertionError, match="does not know"):
        kit.validate(monitor)
    daemonset = next(o for o in base if o["kind"] == "DaemonSet")
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kit.validate(daemonset)


@pytest.mark.parametrize("overlay", ["dev", "production"])
def test_each_overlay_deploys_every_part(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    kinds = Counter(o["kind"] for o in rendered[f"overlays/{overlay}"])
    for kind in (
        "DaemonSet",
        "ServiceMonitor",
        "PrometheusRule",
        "AlertmanagerConfig",
        "Deployment",
        "ClusterRole",
        "RoleBinding",
    ):
        assert kinds[kind] >= 1, f"{overlay}: no {kind}"
    assert kinds["ConfigMap"] >= 6  # five dashboards and the responder's platform settings


def test_the_agent_runs_on_gpu_nodes_with_the_host_pid_namespace(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    ds = next(o for o in rendered["overlays/production"] if o["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    # The proc connector (the ranks' exit codes and signals) is in the host's network
    # namespace only, and older kernels ask for CAP_NET_ADMIN (agent/watch/proc_exits.py).
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "NET_ADMIN" in agent["securityContext"]["capabilities"]["add"]
    assert agent["image"].startswith("ghcr.io/stormwatch/stormwatch-agent:"), "the slim image"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert agent["resources"]["limits"] and agent["resources"]["requests"]


@pytest.mark.parametrize("folder", ["base", "overlays/dev", "overlays/production"])
def test_the_agent_reads_the_kubelets_pod_resources_socket_through_a_read_only_mount(
    rendered: dict[str, list[dict[str, Any]]], folder: str
) -> None:
    ds = next(o for o in rendered[folder] if o["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    # The socket the agent is told, as its own CLI parses the DaemonSet's arguments.
    assert agent["args"][:2] == ["agent", "run"]
    socket = agent_run.make_context("run", agent["args"][2:]).params["pod_resources_socket"]
    assert socket == DEFAULT_SOCKET, "the kubelet's default socket path"
    folder_path = posixpath.dirname(socket)
    (mount,) = [m for m in agent["volumeMounts"] if m["mountPath"] == folder_path]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == folder_path, "the host's folder at the same path"


def test_the_responder_may_cordon_delete_evict_and_read_and_nothing_more(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    roles = {
        o["metadata"]["name"]: o["rules"]
        for o in rendered["overlays/production"]
        if o["kind"] == "ClusterRole"
    }
    granted = {
        (group, resource, verb)
        for rules in roles.values()
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "pods", "list"),
        ("", "pods", "delete"),
        ("", "pods/log", "get"),
        ("", "pods/eviction", "create"),
        ("", "events", "list"),
        ("batch", "jobs", "get"),
        ("jobset.x-k8s.io", "jobsets", "get"),
    }
    # exactly what the backend's API calls need, cluster-wide only for nodes
    assert granted == {(a.group, a.resource, a.verb) for a in RESPONDER_ACCESS}
    cluster_wide = {
        (resource, verb)
        for rule in roles["stormwatch-responder-nodes"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert cluster_wide == {(a.resource, a.verb) for a in RESPONDER_ACCESS if not a.namespaced}
    bindings = [o for o in rendered["overlays/production"] if o["kind"] == "RoleBinding"]
    assert {b["metadata"]["namespace"] for b in bindings} == {"stormwatch", "training"}


def test_the_responder_token_comes_from_a_secret(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    deployment = next(o for o in rendered["overlays/production"] if o["kind"] == "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["token"]["secret"]["secretName"] == "stormwatch-responder-token"
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--platform=kubernetes" in args
    assert not any(o["kind"] == "Secret" for o in rendered["overlays/production"])


def test_the_example_job_is_indexed_torchrun_with_a_headless_rendezvous_service(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["examples/training-job"]
    job = next(o for o in objects if o["kind"] == "Job")
    service = next(o for o in objects if o["kind"] == "Service")
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert job["spec"]["completionMode"] == "Indexed"
    assert (
        service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
    )
    assert container["command"] == ["torchrun"]
    assert (
        f"--rdzv-endpoint={job['metadata']['name']}-0.{service['metadata']['name']}:29500"
        in (container["args"])
    )
    assert COMPLETION_INDEX in env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert service["spec"]["selector"] == {"stormwatch.io/job": job["metadata"]["name"]}


def test_the_dcgm_exporter_component_drops_only_the_agents_dcgm_series(
    kit: Any, tmp_path: Path
) -> None:
    root = Path(os.path.relpath(kit.kubernetes, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{root}/overlays/production]\ncomponents: [{root}/components/dcgm-exporter]\n"
    )
    objects = kit.kustomize(tmp_path)
    for obj in objects:
        kit.validate(obj)
    monitor = next(o for o in objects if o["kind"] == "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["metricRelabelings"] == [
        {"sourceLabels": ["__name__"], "regex": "DCGM_.*", "action": "drop"}
    ]


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_builtin_object_is_also_a_valid_typed_model_of_the_official_client(
    folder: str, rendered: dict[str, list[dict[str, Any]]], kit: Any
) -> None:
    """A second, independent check: the ``kubernetes`` client's pydantic models (unknown
    fields forbidden) read each object and write it back unchanged."""
    for obj in rendered[folder]:
        if (obj["apiVersion"], obj["kind"]) in kit.crd_models:
            continue
        version = obj["apiVersion"].rsplit("/", 1)[-1].capitalize()
        model = getattr(k8s, f"{version}{obj['kind']}")
        typed = model.model_validate(obj)
        assert k8s.ApiClient().sanitize_for_serialization(typed) == obj, obj["metadata"]["name"]
