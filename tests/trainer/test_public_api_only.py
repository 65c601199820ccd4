"""The reference trainer is instrumented through the public telemetry API alone: it imports
``stormwatch.telemetry`` (never one of its modules) and uses only the names of its
``__all__``, as any other job would (issue 16)."""

from __future__ import annotations

import ast
from pathlib import Path

import stormwatch.telemetry as swt

TRAINER = Path(__file__).resolve().parents[2] / "trainer"


def _uses(path: Path) -> list[str]:
    """``where: what`` for every use of stormwatch.telemetry in one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases: set[str] = set()
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(TRAINER.parent)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("stormwatch.telemetry"):
                    found.append(f"{where}: import {alias.name}")
                    aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "stormwatch.telemetry"
        ):
            found.extend(f"{where}: from {node.module} import {a.name}" for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) in aliases:
            found.append(f"{path.relative_to(TRAINER.parent)}:{node.lineno}: .{node.attr}")
    return found


def _private(use: str) -> bool:
    what = use.split(": ", 1)[1]
    if what.startswith("import "):
        return what != "import stormwatch.telemetry"
    if what.startswith("from "):
        module, _, name = what[len("from ") :].partition(" import ")
        return module != "stormwatch.telemetry" or name not in swt.__all__
    return what[1:] not in swt.__all__


def test_the_trainer_uses_only_the_public_telemetry_api() -> None:
    uses = [use for path in sorted(TRAINER.rglob("*.py")) for use in _uses(path)]
    assert uses, "the trainer reports nothing through stormwatch.telemetry?"
    assert [use for use in uses if _private(use)] == []


def test_the_check_catches_a_private_import() -> None:
    assert _private("trainer/x.py:1: from stormwatch.telemetry.rank import RankTelemetry")
    assert _private("trainer/x.py:1: from stormwatch.telemetry import RankTelemetry")
    assert _private("trainer/x.py:1: import stormwatch.telemetry.comms")
    assert _private("trainer/x.py:1: ._CURRENT")
    assert not _private("trainer/x.py:1: .StepRecord")
