"""The shipped Prometheus rule files and their promtool checks.

Rule files live in ``rules/*.yml`` inside this package, their promtool unit
tests in ``tests/*.yml`` (each test file names its rule files relative to
itself, as promtool expects). The lab points Prometheus at :func:`rules_dir`.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stormwatch.alerts.errors import ToolError

_PACKAGE_DIR = Path(__file__).resolve().parent
#: Seconds a promtool run may take; the shipped tests take well under 5 s.
PROMTOOL_TIMEOUT_S = 120.0


def rules_dir() -> Path:
    """Folder holding the shipped rule files (``*.yml``), for Prometheus' ``rule_files``."""
    return _PACKAGE_DIR / "rules"


def rule_files() -> list[Path]:
    """The shipped rule files, sorted by name."""
    return sorted(rules_dir().glob("*.yml"))


def rule_test_files() -> list[Path]:
    """The shipped promtool unit-test files, sorted by name."""
    return sorted((_PACKAGE_DIR / "tests").glob("*.yml"))


@dataclass(frozen=True)
class ToolRun:
    """Outcome of one promtool/amtool invocation.

    Attributes:
        command: the argument vector that ran.
        returncode: the tool's exit status (0 = passed).
        output: combined stdout and stderr.
    """

    command: tuple[str, ...]
    returncode: int
    output: str

    @property
    def ok(self) -> bool:
        """True when the tool exited 0."""
        return self.returncode == 0


def find_tool(name: str) -> str:
    """Absolute path of an executable on ``PATH``.

    Raises:
        ToolError: not found (install the Debian package ``prometheus`` for
            ``promtool``, ``prometheus-alertmanager`` for ``amtool``).
    """
    path = shutil.which(name)
    if path is None:
        raise ToolError(
            f"{name} not found on PATH; install it (Debian: apt-get install "
            f"{'prometheus' if name == 'promtool' else 'prometheus-alertmanager'})"
        )
    return path


def run_tool(argv: Sequence[str], *, timeout_s: float = PROMTOOL_TIMEOUT_S) -> ToolRun:
    """Run a checker tool and capture its output; a failing check is not an exception.

    Raises:
        ToolError: the tool is missing or did not finish within ``timeout_s``.
    """
    command = (find_tool(argv[0]), *argv[1:])
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ToolError(f"{argv[0]} did not finish within {timeout_s:g} s") from exc
    return ToolRun(command=command, returncode=done.returncode, output=done.stdout + done.stderr)


def check_rules(files: Sequence[Path] | None = None) -> ToolRun:
    """``promtool check rules`` on ``files`` (default: the shipped rule files).

    Raises:
        ToolError: promtool is missing, or there are no files to check.
    """
    paths = list(files) if files is not None else rule_files()
    if not paths:
        raise ToolError(f"no rule files found in {rules_dir()}")
    return run_tool(["promtool", "check", "rules", *map(str, paths)])


def run_rule_tests(files: Sequence[Path] | None = None) -> ToolRun:
    """``promtool test rules`` on ``files`` (default: the shipped unit tests).

    Raises:
        ToolError: promtool is missing, or there are no test files.
    """
    paths = list(files) if files is not None else rule_test_files()
    if not paths:
        raise ToolError(f"no promtool test files found in {_PACKAGE_DIR / 'tests'}")
    return run_tool(["promtool", "test", "rules", *map(str, paths)])


__all__ = [
    "ToolRun",
    "check_rules",
    "find_tool",
    "rule_files",
    "rule_test_files",
    "rules_dir",
    "run_rule_tests",
    "run_tool",
]
