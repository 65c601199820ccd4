"""Helpers for the deployment tests: the repository's deploy/ folder, kustomize, YAML, and the
schema check every rendered object passes (:meth:`DeployKit.validate`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as monitoring_v1
from cloudcoil.models.prometheus_operator import v1alpha1 as monitoring_v1alpha1

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())


class KubeLoader(yaml.SafeLoader):
    """YAML as the API server reads it: kustomize writes ``matchType: =`` unquoted, which
    PyYAML's YAML 1.1 resolver would turn into the ``!!value`` tag; go-yaml reads a string."""


KubeLoader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:value"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class DeployKit:
    """What the deployment tests share (the ``kit`` fixture)."""

    repo = REPO
    deploy = DEPLOY
    kubernetes = KUBERNETES
    overlays = OVERLAYS
    #: Kubernetes release whose OpenAPI schemas built-in kinds are checked against.
    k8s_version = kubernetes_validate.latest_version()
    #: Prometheus Operator kinds, which kubernetes-validate has no schema for: the pydantic
    #: models generated from the operator's published CRD schemas.
    crd_models: dict[tuple[str, str], Any] = {
        ("monitoring.coreos.com/v1", "ServiceMonitor"): monitoring_v1.ServiceMonitor,
        ("monitoring.coreos.com/v1", "PrometheusRule"): monitoring_v1.PrometheusRule,
        (
            "monitoring.coreos.com/v1alpha1",
            "AlertmanagerConfig",
        ): monitoring_v1alpha1.AlertmanagerConfig,
    }

    @classmethod
    def validate(cls, obj: dict[str, Any]) -> None:
        """Built-in kinds: ``kubernetes-validate``, strict (unknown fields fail). Operator
        kinds: their CRD model; a field the model does not know would be dropped, so the
        object must come back unchanged from a validate-dump round trip."""
        key = (obj["apiVersion"], obj["kind"])
        if key in cls.crd_models:
            model = cls.crd_models[key].model_validate(obj)
            assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == obj, (
                f"{key[1]} {obj['metadata']['name']}: fields the CRD schema does not know"
            )
        else:
            kubernetes_validate.validate(obj, cls.k8s_version, strict=True)

    @staticmethod
    def load_objects(text: str) -> list[dict[str, Any]]:
        """The non-empty documents of a YAML stream."""
        return [doc for doc in yaml.load_all(text, Loader=KubeLoader) if doc]

    @staticmethod
    def kustomize(folder: Path) -> list[dict[str, Any]]:
        """``kubectl kustomize folder``, parsed; fails the test with kubectl's message."""
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            pytest.fail("kubectl is not installed: run `make system` (Debian: kubernetes-client)")
        done = subprocess.run(
            [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"kubectl kustomize {folder} failed:\n{done.stderr}"
        return DeployKit.load_objects(done.stdout)

    @staticmethod
    def render(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        """Run deploy/render.py with the test's Python."""
        return subprocess.run(
            [sys.executable, str(DEPLOY / "render.py"), "--out", str(out), *extra],
            capture_output=True,
            text=True,
            timeout=300,
        )


@pytest.fixture(scope="session")
def kit() -> type[DeployKit]:
    return DeployKit
