"""The shipped Prometheus rule files and their promtool checks.

Rule files live in ``rules/*.yml`` inside this package, their promtool unit
tests in ``tests/*.yml`` (each test file names its rule files relative to
itself, as promtool expects). The lab points Prometheus at :func:`rules_dir`.

Every alert's ``runbook_url`` annotation is absolute (Alertmanager, Grafana and PagerDuty
link it as it is): :data:`DEFAULT_RUNBOOK_BASE_URL` + ``#`` + the alert's name in lower case,
a heading of docs/runbooks.md. A site that publishes the runbooks elsewhere writes the rule
files with its own base (:func:`write_rule_files`, ``stormwatch alerts render-rules
--runbook-base-url``, or ``STORMWATCH_RUNBOOK_BASE_URL``; the Helm chart's
``runbookBaseUrl``).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from stormwatch.alerts.errors import ToolError
from stormwatch.errors import ConfigError
from stormwatch.urls import is_http_url

_PACKAGE_DIR = Path(__file__).resolve().parent
#: Seconds one promtool run (one file) may take. The shipped unit tests evaluate every rule
#: each second (every 10 s in training_trends_test.yml, whose windows are up to half an
#: hour); the longest file takes about 15 s on an idle 2-core machine, a minute when busy.
PROMTOOL_TIMEOUT_S = 300.0


def rules_dir() -> Path:
    """Folder holding the shipped rule files (``*.yml``), for Prometheus' ``rule_files``."""
    return _PACKAGE_DIR / "rules"


def rule_files() -> list[Path]:
    """The shipped rule files, sorted by name."""
    return sorted(rules_dir().glob("*.yml"))


#: docs/runbooks.md as the project's repository renders it (headings become ``#anchors``).
DEFAULT_RUNBOOK_BASE_URL = "https://github.com/stormwatch/stormwatch/blob/main/docs/runbooks.md"
#: Environment variable of ``stormwatch alerts render-rules --runbook-base-url``.
RUNBOOK_BASE_ENV = "STORMWATCH_RUNBOOK_BASE_URL"


def runbook_url(alert: str, base: str = DEFAULT_RUNBOOK_BASE_URL) -> str:
    """The runbook of ``alert``: ``base#<alert in lower case>``.

    Raises:
        ConfigError: ``base`` is not an absolute http(s) URL, or has a ``#fragment``.
    """
    if not is_http_url(base) or "#" in base:
        raise ConfigError(
            f"runbook base URL: {base!r} is not an absolute http(s) URL without a #fragment, "
            f"e.g. {DEFAULT_RUNBOOK_BASE_URL}"
        )
    return f"{base}#{alert.lower()}"


def rule_groups(runbook_base: str = DEFAULT_RUNBOOK_BASE_URL) -> list[dict[str, Any]]:
    """The rule groups of the shipped files, every alert's ``runbook_url`` on ``runbook_base``.

    Raises:
        ConfigError: ``runbook_base`` is not an absolute http(s) URL.
    """
    groups: list[dict[str, Any]] = []
    for path in rule_files():
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rule.setdefault("annotations", {})["runbook_url"] = runbook_url(
                        rule["alert"], runbook_base
                    )
            groups.append(group)
    return groups


def write_rule_files(out: Path, runbook_base: str) -> list[Path]:
    """Write the shipped rule files into ``out`` (same names), runbooks on ``runbook_base``.

    Raises:
        ConfigError: ``runbook_base`` is not an absolute http(s) URL, or ``out`` cannot be
            written (named as ``--out``).
    """
    prefix = runbook_url("", runbook_base)  # raises before anything is written
    shipped = [(path.name, path.read_text(encoding="utf-8")) for path in rule_files()]
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in shipped:
            # A textual swap keeps the files' comments and layout; the shipped files hold the
            # default base in every runbook_url (tests/alerts/test_rules.py).
            target = out / name
            target.write_text(
                text.replace(
                    f'runbook_url: "{DEFAULT_RUNBOOK_BASE_URL}#',
                    f'runbook_url: "{prefix}',
                ),
                encoding="utf-8",
            )
            written.append(target)
    except OSError as exc:  # as dashboards build and plan report it
        raise ConfigError(f"--out: cannot write {out}: {exc}; pick a writable folder") from exc
    return written


@click.command("render-rules")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder to write the rule files (*.yml) into.",
)
@click.option(
    "--runbook-base-url",
    envvar=RUNBOOK_BASE_ENV,
    show_envvar=True,
    default=DEFAULT_RUNBOOK_BASE_URL,
    show_default=True,
    help="Absolute URL of the runbooks page; each alert links to URL#<alert name, lower case>.",
)
def render_rules_cmd(out: Path, runbook_base_url: str) -> None:
    """Write the shipped rule files with every runbook_url on your runbook base URL.

    For a site that publishes docs/runbooks.md elsewhere (an internal wiki or docs site):
    point Prometheus' rule_files at OUT instead of `stormwatch alerts rules-path`.
    """
    for path in write_rule_files(out, runbook_base_url):
        click.echo(str(path))


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
    # One promtool per file, side by side (promtool runs a file's tests on one core); the
    # output in the files' order, the worst exit status.
    workers = max(1, min(len(paths), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        runs = list(pool.map(lambda p: run_tool(["promtool", "test", "rules", str(p)]), paths))
    return ToolRun(
        command=("promtool", "test", "rules", *map(str, paths)),
        returncode=max(run.returncode for run in runs),
        output="".join(run.output for run in runs),
    )


__all__ = [
    "DEFAULT_RUNBOOK_BASE_URL",
    "RUNBOOK_BASE_ENV",
    "ToolRun",
    "check_rules",
    "find_tool",
    "render_rules_cmd",
    "rule_files",
    "rule_groups",
    "rule_test_files",
    "rules_dir",
    "run_rule_tests",
    "run_tool",
    "runbook_url",
    "write_rule_files",
]
