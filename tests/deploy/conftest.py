"""Helpers for the deployment tests: the repository's deploy/ folder, kustomize, YAML."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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
