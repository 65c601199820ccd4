"""The package layout, checked: import direction, no cycles, no torch where none is needed,
size and folder limits, and the exception tree (issue 14, docs/ARCHITECTURE.md).

Imports are read statically (the AST of every module, function-level imports included,
``if TYPE_CHECKING:`` blocks left out), so a lazy import counts as much as a top-level
one; whether torch is imported is checked by importing in a fresh interpreter.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import importlib
import inspect
import itertools
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The component packages (``<folder>`` installs as ``stormwatch.<folder>``).
COMPONENTS = ("agent", "trainer", "chaos", "alerts", "dashboards", "lab", "plan")
#: Packages every component may use, besides the shared home (``stormwatch/``).
SHARED = ("faults", "postmortem", "telemetry")
#: Every package folder of the repository that exists (``postmortem`` lands later).
PACKAGES = tuple(
    name for name in ("stormwatch", *SHARED, *COMPONENTS) if (REPO / name / "__init__.py").is_file()
)

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_MODULES_PER_FOLDER = 15
#: A literal display (dict, list, tuple, set) with at least this many items is a
#: declarative table: its lines do not count towards a function's length.
TABLE_ITEMS = 5


@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement's target, where it stands and whether it runs lazily."""

    source: str  # importing module, dotted
    target: str  # imported module (or package the name comes from), dotted
    where: str  # path:line
    lazy: bool  # inside a function


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] != "stormwatch":
        parts.insert(0, "stormwatch")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts)


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def _imports_of(path: Path) -> Iterator[Import]:
    source = _module_name(path)
    tree = _tree(path)
    skipped = _type_checking_nodes(tree)
    lazy: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lazy.update(id(inner) for inner in ast.walk(node) if inner is not node)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(source, alias.name, where, id(node) in lazy)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = source.split(".")
                base = base if path.name == "__init__.py" else base[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield Import(source, target, where, id(node) in lazy)


@functools.cache
def _all_imports() -> tuple[Import, ...]:
    return tuple(
        found
        for package in PACKAGES
        for path in _modules(package)
        for found in _imports_of(path)
        if found.target.startswith("stormwatch")
    )


def _package_of(module: str) -> str:
    """``agent`` for ``stormwatch.agent.x``; ``stormwatch`` for the shared home."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in (*SHARED, *COMPONENTS):
        return parts[1]
    return "stormwatch"


Importers = Callable[[str], bool]


def _offending(importers: Importers, forbidden: set[str]) -> list[str]:
    return [
        f"{found.where}: {found.source} imports {found.target}"
        for found in _all_imports()
        if importers(found.source) and _package_of(found.target) in forbidden
    ]


def _in(package: str) -> Importers:
    return lambda module: _package_of(module) == package


def _shared_home_except_cli_and_platforms(module: str) -> bool:
    return (
        _package_of(module) == "stormwatch"
        and module != "stormwatch.cli"
        and not module.startswith("stormwatch.platforms")
    )


#: rule -> (which importing modules it covers, the packages they must not import)
IMPORT_RULES: dict[str, tuple[Importers, set[str]]] = {
    "the agent imports none of chaos, alerts, trainer, lab, plan": (
        _in("agent"),
        {"chaos", "alerts", "trainer", "lab", "plan"},
    ),
    "chaos imports nothing from alerts": (_in("chaos"), {"alerts"}),
    "alerts imports nothing from chaos": (_in("alerts"), {"chaos"}),
    "stormwatch.faults imports no component package": (_in("faults"), set(COMPONENTS)),
    "stormwatch.postmortem imports no component package": (_in("postmortem"), set(COMPONENTS)),
    "stormwatch.telemetry imports no component package": (_in("telemetry"), set(COMPONENTS)),
    "the shared home (but cli.py and platforms/) imports no component package": (
        _shared_home_except_cli_and_platforms,
        set(COMPONENTS),
    ),
    "stormwatch.platforms uses no component package but stormwatch.lab": (
        lambda module: module.startswith("stormwatch.platforms"),
        set(COMPONENTS) - {"lab"},
    ),
}


@pytest.mark.parametrize("rule", list(IMPORT_RULES))
def test_import_direction(rule: str) -> None:
    importers, forbidden = IMPORT_RULES[rule]
    assert _offending(importers, forbidden) == [], rule


def test_the_root_cli_imports_the_components_lazily() -> None:
    eager = [
        f"{found.where}: {found.target}"
        for found in _all_imports()
        if found.source == "stormwatch.cli"
        and _package_of(found.target) in COMPONENTS
        and not found.lazy
    ]
    assert eager == [], "stormwatch --help must not import a component"


def _node_of(module: str) -> str | None:
    """The top-level package a module belongs to; the shared home counts per sub-package
    (``stormwatch.clients``, ``stormwatch.platforms``, ...), its CLI root not at all."""
    package = _package_of(module)
    if package != "stormwatch":
        return package
    parts = module.split(".")
    if parts[:2] == ["stormwatch", "cli"]:
        return None  # the composition root: imports every component, lazily
    return ".".join(parts[:2])


def test_no_import_cycle_between_top_level_packages() -> None:
    edges: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for found in _all_imports():
        source, target = _node_of(found.source), _node_of(found.target)
        if source is not None and target is not None and source != target:
            edges[source].setdefault(target, found.where)
    cycles = []
    for start in sorted(edges):
        # depth-first search for a path from each successor back to start
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges.get(node, {})):
                if nxt == start:
                    hops = [*path, start]
                    cycles.append(
                        " -> ".join(hops)
                        + " ("
                        + ", ".join(edges[a][b] for a, b in itertools.pairwise(hops))
                        + ")"
                    )
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert cycles == []


_NO_TORCH = """
import importlib, pkgutil, sys
module = importlib.import_module(sys.argv[1])
if sys.argv[2] == "all" and hasattr(module, "__path__"):
    for info in pkgutil.walk_packages(module.__path__, sys.argv[1] + "."):
        importlib.import_module(info.name)
print(" ".join(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))
"""


@pytest.mark.parametrize(
    "package",
    [
        "stormwatch.faults",
        "stormwatch.agent",
        "stormwatch.clients",
        "stormwatch.otel",
        "stormwatch.sqlite",
        "stormwatch.contracts",
        "stormwatch",  # the whole shared home, every module of it
    ],
)
def test_importing_does_not_import_torch(package: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, package, "all"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    )
    assert out.stdout.split() == [], f"importing {package} (and its modules) imports torch"


#: The telemetry API's modules that count collectives or wait for the process group:
#: they import torch, and only a session that instruments collectives imports them
#: (framework integrations, ``integrations.*``, import their framework).
TELEMETRY_TORCH_MODULES = {"collective_ops", "comms", "lifecycle.hooks"}


@pytest.mark.parametrize(
    "module",
    [
        "stormwatch.telemetry",
        *(
            f"stormwatch.telemetry.{name}"
            for path in sorted((REPO / "telemetry").rglob("*.py"))
            if "__pycache__" not in path.parts
            and (name := ".".join(path.relative_to(REPO / "telemetry").with_suffix("").parts))
            and not name.endswith("__init__")
            and name not in TELEMETRY_TORCH_MODULES
            and not name.startswith("integrations")
        ),
    ],
)
def test_the_telemetry_api_imports_no_torch(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, module, "top"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    )
    assert out.stdout.split() == [], f"importing {module} imports torch"


# ------------------------------------------------------------------ size limits
@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_the_line_limit(package: str) -> None:
    long = {
        str(path.relative_to(REPO)): n
        for path in _modules(package)
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these by responsibility (limit {MAX_MODULE_LINES} lines)"


def _table_lines(node: ast.AST) -> set[int]:
    lines: set[int] = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Dict):
            items = len(inner.keys)
        elif isinstance(inner, (ast.List, ast.Tuple, ast.Set)):
            items = len(inner.elts)
        else:
            continue
        if items >= TABLE_ITEMS:
            lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_over_the_line_limit(package: str) -> None:
    long = {}
    for path in _modules(package):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
                n = len(span - _table_lines(node))
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = n
    assert long == {}, f"split these (limit {MAX_FUNCTION_LINES} lines outside tables)"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_folder_level_over_the_module_limit(package: str) -> None:
    counts = collections.Counter(
        str(path.parent.relative_to(REPO))
        for path in _modules(package)
        if path.name != "__init__.py"
    )
    crowded = {folder: n for folder, n in counts.items() if n > MAX_MODULES_PER_FOLDER}
    assert crowded == {}, f"regroup by responsibility (limit {MAX_MODULES_PER_FOLDER} modules)"


# -------------------------------------------------------------- exception tree
def _imported(package: str) -> list[ModuleType]:
    return [importlib.import_module(_module_name(path)) for path in _modules(package)]


def _exception_classes(package: str) -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in _imported(package):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, BaseException):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[name] for name in sorted(found)]


def _errors_package(cls: type) -> str | None:
    """``stormwatch.agent`` for a class of ``stormwatch.agent.errors``; None elsewhere."""
    module = cls.__module__
    if module == "stormwatch.errors":
        return "stormwatch"
    parts = module.split(".")
    if len(parts) == 3 and parts[0] == "stormwatch" and parts[2] == "errors":
        return ".".join(parts[:2])
    return None


@dataclasses.dataclass(frozen=True)
class Drawn:
    package: str  # dotted package whose errors module defines it
    name: str
    parent: Drawn | None


def _drawn_tree(docstring: str) -> list[Drawn]:
    """The nodes of the first ``::`` tree of ``docstring``: a dotted name
    (``stormwatch.agent.AgentError``) starts a package; names below it belong to it."""
    block = docstring.split("::\n", 1)[1].strip("\n").split("\n\n", 1)[0]
    nodes: list[Drawn] = []
    chain: list[Drawn] = []
    for line in block.splitlines():
        connector = re.search(r"[├└]── ", line)
        depth = 0 if connector is None else connector.start() // 4
        text = line[connector.end() :] if connector else line.strip()
        name = text.split()[0]
        parent = chain[depth - 1] if connector else None
        package, _, short = name.rpartition(".")
        if not package:
            package = parent.package if parent is not None else "stormwatch"
        node = Drawn(package, short, parent)
        del chain[depth:]
        chain.append(node)
        nodes.append(node)
    return nodes


def _resolve(node: Drawn) -> type:
    module = "stormwatch.errors" if node.package == "stormwatch" else f"{node.package}.errors"
    return getattr(importlib.import_module(module), node.name)


@functools.cache
def _root_tree() -> tuple[Drawn, ...]:
    import stormwatch.errors

    return tuple(_drawn_tree(stormwatch.errors.__doc__ or ""))


def test_the_drawn_tree_names_real_classes_under_their_bases() -> None:
    wrong = []
    for node in _root_tree():
        try:
            cls = _resolve(node)
        except (ImportError, AttributeError) as exc:
            wrong.append(f"{node.package}.{node.name}: no such class ({exc})")
            continue
        if node.parent is not None and not issubclass(cls, _resolve(node.parent)):
            wrong.append(f"{node.package}.{node.name} is drawn under {node.parent.name}")
    assert wrong == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exception_class_lives_in_an_errors_module(package: str) -> None:
    elsewhere = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in _exception_classes(package)
        if _errors_package(cls) is None
    ]
    assert elsewhere == [], "move these into the package's errors module"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exception_class_is_drawn_in_the_root_tree(package: str) -> None:
    drawn = {(node.package, node.name) for node in _root_tree()}
    missing = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in _exception_classes(package)
        if (_errors_package(cls) or cls.__module__, cls.__name__) not in drawn
    ]
    assert missing == [], "draw these in stormwatch/errors.py's tree"


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_docstring_draws_its_own_exceptions(package: str) -> None:
    missing = []
    for cls in _exception_classes(package):
        owner = _errors_package(cls)
        if owner is None or owner == "stormwatch":  # the root's tree is stormwatch/errors.py
            continue
        doc = importlib.import_module(owner).__doc__ or ""
        if not re.search(rf"\b{cls.__name__}\b", doc):
            missing.append(f"{owner}: {cls.__name__}")
    assert missing == [], "draw these in their package docstring's tree"


# ------------------------------------------------------- handling of failures
#: Branching on an exception's text: ``"x" in str(exc)``, ``str(e) == ...``, ``exc.args[0]``.
_ON_TEXT = re.compile(r"\bin str\(\w+\)|\bstr\(\w+\) ?[!=]=|\.args\[\d\]")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_code_branches_on_exception_text(package: str) -> None:
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in _modules(package)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _ON_TEXT.search(line)
    ]
    assert found == [], "branch on the exception's type or attributes, not its text"


def _quiet(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr):
        value = stmt.value
        if isinstance(value, ast.Constant):
            return True
        return isinstance(value, ast.Call) and getattr(value.func, "attr", "") == "debug"
    return False


@pytest.mark.parametrize("package", PACKAGES)
def test_failures_swallowed_quietly_say_why(package: str) -> None:
    """A handler that only passes or logs at debug, and ``contextlib.suppress``, carry a
    comment saying why staying quiet is right; anything else logs at warning or above,
    counts, or re-raises."""
    silent = []
    for path in _modules(package):
        lines = path.read_text(encoding="utf-8").splitlines()

        def commented(*numbers: int, lines: list[str] = lines) -> bool:
            return any("#" in lines[n - 1] for n in numbers if 0 < n <= len(lines))

        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ExceptHandler) and all(_quiet(s) for s in node.body):
                body = node.body[0].lineno
                if not commented(node.lineno, body, body + 1):
                    silent.append(f"{path.relative_to(REPO)}:{node.lineno}")
            elif (
                isinstance(node, ast.With)
                and any("suppress" in ast.unparse(item.context_expr) for item in node.items)
                and not commented(node.lineno, node.lineno - 1)
            ):
                silent.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert silent == [], "log at warning, count, re-raise, or say in a comment why not"
