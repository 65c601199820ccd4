"""Dependencies that behave: a slim agent install, no package that rewrites another's files,
pins in constraints.txt, and one declared set of Python versions."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from stormwatch.cli import EXTRA_OF_MODULE

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
HEAVY = {"torch", "numpy", "matplotlib"}
#: What grafana-client brought: urllib3-future's .pth swaps urllib3 for every package.
NEVER = {"grafana-client", "niquests", "urllib3-future"}


def _requirements(extras: frozenset[str]) -> list[Requirement]:
    """The project's own requirements for ``extras`` (self-references expanded)."""
    out, seen, todo = [], set(), set(extras)
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for text in PROJECT["optional-dependencies"][extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "stormwatch":
                todo |= req.extras - seen
            else:
                reqs.append(req)
    for req in reqs:
        out.append(req)
    return out


def _closure(extras: frozenset[str]) -> set[str]:
    """Every distribution ``stormwatch[extras]`` installs, from the installed metadata."""
    found: set[str] = set()
    todo = [(req, frozenset[str]()) for req in _requirements(extras)]
    while todo:
        req, active = todo.pop()
        if req.marker is not None and not any(
            req.marker.evaluate({"extra": e}) for e in (active or {""})
        ):
            continue
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in found:
            continue
        found.add(key)
        for text in md.requires(name) or []:
            todo.append((Requirement(text), frozenset(req.extras)))
    return {key.partition("[")[0] for key in found}


def test_the_agent_install_pulls_no_torch_numpy_matplotlib_or_grafana_client() -> None:
    agent = _closure(frozenset({"agent"}))
    assert "prometheus-client" in agent and "nvidia-ml-py" in agent
    assert not agent & (HEAVY | NEVER), sorted(agent & (HEAVY | NEVER))
    everything = _closure(frozenset({"all"}))
    assert everything >= HEAVY, "the extras still install the trainer and the reports"
    assert not everything & NEVER


def test_the_agent_command_imports_no_torch_numpy_or_matplotlib() -> None:
    """The agent's entry point and every module of the agent package, in a fresh interpreter
    where importing torch, numpy or matplotlib fails."""
    code = (
        "import sys, importlib, pkgutil\n"
        f"for name in {sorted(HEAVY)!r}:\n"
        "    sys.modules[name] = None  # an import now raises ModuleNotFoundError\n"
        "from stormwatch.cli import root\n"
        "import click\n"
        "agent = root.get_command(click.Context(root), 'agent')\n"
        "agent.get_command(click.Context(agent), 'run')\n"
        "import stormwatch.agent as package\n"
        "for info in pkgutil.walk_packages(package.__path__, 'stormwatch.agent.'):\n"
        "    importlib.import_module(info.name)\n"
        f"print(sorted(m for m in sys.modules if m.partition('.')[0] in {sorted(HEAVY)!r}"
        " and sys.modules[m] is not None))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_command_that_needs_an_extra_names_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['numpy'] = None\n"
        "from stormwatch.cli import main\n"
        "main(['plan', '--help'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'stormwatch[reports]'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("module", "extra"), sorted(EXTRA_OF_MODULE.items()))
def test_each_extra_the_cli_names_installs_the_module(module: str, extra: str) -> None:
    providers = {canonicalize_name(d) for d in md.packages_distributions().get(module, [])}
    requirements = {canonicalize_name(r.name) for r in _requirements(frozenset({extra}))}
    core = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    assert providers & (requirements - core), f"stormwatch[{extra}] does not install {module}"


def test_urllib3_is_the_urllib3_pip_installed() -> None:
    """No installed package replaces urllib3's files (urllib3-future's .pth did)."""
    code = (
        "import urllib3, importlib.metadata as m; print(urllib3.__version__, m.version('urllib3'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/"
    )
    imported, recorded = done.stdout.split()
    assert imported == recorded


def test_no_installed_package_runs_code_at_interpreter_start() -> None:
    """A ``.pth`` line that starts with ``import`` runs at every interpreter start; only pip's
    editable installs and setuptools' distutils shim may have one."""
    allowed = re.compile(r"__editable__.*\.pth|distutils-precedence\.pth")
    offenders = []
    for folder in {Path(p) for p in sys.path if p.endswith("site-packages")}:
        for pth in folder.glob("*.pth"):
            lines = pth.read_text(errors="replace").splitlines()
            runs_code = any(line.startswith(("import ", "import\t")) for line in lines)
            if runs_code and not allowed.fullmatch(pth.name):
                offenders.append(str(pth))
    assert not offenders


def test_constraints_pin_exact_versions_of_the_whole_dev_install() -> None:
    lines = [
        line
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    pins = {}
    for line in lines:
        name, sep, version = line.partition("==")
        assert sep and version and ";" not in line, f"not an exact pin: {line}"
        pins[canonicalize_name(name)] = version
    torch_family = re.compile(r"torch|triton|nvidia-.*")
    wanted = {n for n in _closure(frozenset({"dev"})) if not torch_family.fullmatch(n)}
    assert not wanted - set(pins), sorted(wanted - set(pins))
    assert not set(pins) & NEVER
    assert "torch" not in pins, "torch follows TORCH_SPEC"
    makefile = (REPO / "Makefile").read_text()
    assert "-c constraints.txt -e '.[dev]'" in makefile
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    assert dockerfile.count("-c /src/constraints.txt") == 2


def test_python_versions_are_declared_once_and_agree() -> None:
    """requires-python, the classifiers, ruff's and mypy's target and the image's Python."""
    minimum = re.fullmatch(r">=(\d+)\.(\d+)", PROJECT["requires-python"])
    assert minimum, "requires-python is a lower bound only"
    low = (int(minimum[1]), int(minimum[2]))
    classified = sorted(
        tuple(int(p) for p in c.rsplit(":: ", 1)[1].split("."))
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert classified and classified[0] == low
    assert all(SpecifierSet(PROJECT["requires-python"]).contains(f"{a}.{b}") for a, b in classified)
    assert sys.version_info[:2] in classified, "the suite runs on a declared version"
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{low[0]}{low[1]}"
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"{low[0]}.{low[1]}"
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    images = {
        tuple(map(int, v.split("."))) for v in re.findall(r"FROM python:(\d+\.\d+)", dockerfile)
    }
    assert images and images <= set(classified)
