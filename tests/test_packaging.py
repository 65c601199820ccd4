"""Packaging: every component installs as stormwatch.<folder>, from a wheel too,
and every CLI command has useful help."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("faults", "postmortem", "agent", "trainer", "chaos", "alerts", "dashboards")
#: The shared home's public modules (stormwatch/), each with its own __all__.
SHARED = ("clients", "platforms", "otel", "sqlite")


@pytest.mark.parametrize(
    "component", ("stormwatch", *(f"stormwatch.{c}" for c in (*SHARED, *COMPONENTS)))
)
def test_public_all_lists_what_the_package_exports(component: str) -> None:
    module = importlib.import_module(component)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{component} has no __all__"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{component}.__all__ names missing attributes: {missing}"
    assert len(set(exported)) == len(exported), f"{component}.__all__ has duplicates"


def _walk(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, f"{' '.join(path)} lists {name} but cannot load it"
            found.extend(_walk(sub, (*path, name)))
    return found


def test_every_command_has_help() -> None:
    from stormwatch.cli import root

    runner = CliRunner()
    commands = _walk(root)
    top = {path[0] for path in commands if path}
    assert top >= {"train", "agent", "lab", "chaos", "alerts", "demo"}
    for path in commands:
        result = runner.invoke(root, [*path, "--help"])
        assert result.exit_code == 0, f"stormwatch {' '.join(path)} --help failed: {result.output}"
        assert "Usage:" in result.output
        # A real description, not just the usage line.
        body = result.output.split("\n", 2)[-1].strip()
        assert len(body) > 20, f"stormwatch {' '.join(path)} --help says nothing useful"


def test_console_script_runs_without_importing_torch() -> None:
    script = Path(sys.executable).with_name("stormwatch")
    out = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "chaos" in out.stdout and "lab" in out.stdout
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, stormwatch.cli as c; c.root.main(['--help'], standalone_mode=False);"
            "print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert probe.stdout.strip().endswith("False"), "stormwatch --help imported torch"


def test_user_error_has_no_traceback_and_exit_2(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("stormwatch")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ntitle: t\nnot_a_field: 3\n")
    out = subprocess.run(
        [str(script), "chaos", "validate", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "not_a_field" in out.stderr


def test_wheel_installs_every_component_outside_the_repo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(dist.glob("stormwatch-*.whl"))
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    code = (
        "import importlib, stormwatch\n"
        f"for c in {COMPONENTS!r}:\n"
        "    m = importlib.import_module('stormwatch.' + c)\n"
        f"    assert m.__file__.startswith({str(target)!r}), m.__file__\n"
        "import stormwatch.alerts as a, pathlib\n"
        "rules = list(pathlib.Path(a.__file__).parent.glob('rules/*.yml'))\n"
        "assert rules, 'rule files missing from the wheel'\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
