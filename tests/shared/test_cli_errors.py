"""A mistake on the command line is one ``error:`` line naming the fix, as every other error
is (fresh-user pass: click's own was three lines, Usage / Try / Error). Real processes: the
console script's ``main``, which ``CliRunner`` does not go through."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))


@pytest.mark.parametrize(
    ("args", "line", "command"),
    [
        (["lab", "train", "--job", "x"], "error: Missing option '--steps'", "stormwatch lab train"),
        (
            ["lab", "trian"],
            "error: No such command 'trian'. Did you mean 'train'?",
            "stormwatch lab",
        ),
        (["chaos", "run", "--bogus"], "error: No such option '--bogus'", "stormwatch chaos run"),
        # click raises these without the command's context (breaker's finding: they named
        # `stormwatch --help`)
        (
            ["-v", "lab", "status", "--run-dir"],
            "error: Option '--run-dir' requires an argument",
            "stormwatch lab status",
        ),
        (  # a root option's value is not a command's name (breaker: it named `stormwatch`)
            ["--log-format", "json", "-vv", "lab", "status", "--run-dir"],
            "error: Option '--run-dir' requires an argument",
            "stormwatch lab status",
        ),
        (
            ["lab", "status", "--json=1"],
            "error: Option '--json' does not take a value",
            "stormwatch lab status",
        ),
    ],
)
def test_a_usage_error_is_one_line_pointing_at_the_command_s_help(
    args: list[str], line: str, command: str
) -> None:
    done = subprocess.run([STORMWATCH, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"{line} (see `{command} --help`)"], done.stderr


def test_a_group_without_a_command_still_shows_its_help() -> None:
    done = subprocess.run([STORMWATCH, "lab"], capture_output=True, text=True, timeout=60)
    shown = done.stdout + done.stderr  # click 8.2+: on stderr, exit status 2
    assert shown.startswith("Usage: stormwatch lab [OPTIONS] COMMAND"), shown
    assert "error:" not in shown
