"""A mistake on the command line is one ``error:`` line naming the fix, as every other error
is (fresh-user pass: click's own was three lines, Usage / Try / Error). Real processes: the
console script's ``main``, which ``CliRunner`` does not go through."""

from __future__ import annotations

import json
import os
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
            ["--log-format", "text", "-vv", "lab", "status", "--run-dir"],
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


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        (
            ["--log-format", "json", "lab", "status", "--run-dir"],
            {},
            2,
            "Option '--run-dir' requires an argument (see `stormwatch lab status --help`)",
        ),
        (
            ["--log-format=json", "chaos", "ledger", "--run-dir", "/nonexistent"],
            {},
            1,
            "no fault ledger at /nonexistent/chaos/ledger.sqlite3",
        ),
        (  # repeated: the last one wins, as click reads it (breaker)
            ["--log-format", "text", "--log-format", "json", "chaos", "ledger", "--run-dir", "/x"],
            {},
            1,
            "no fault ledger at /x/chaos/ledger.sqlite3",
        ),
        (
            ["chaos", "ledger", "--run-dir", "/nonexistent"],
            {"STORMWATCH_LOG_FORMAT": "json"},
            1,
            "no fault ledger at /nonexistent/chaos/ledger.sqlite3",
        ),
    ],
)
def test_with_json_logs_an_error_is_a_json_log_line(
    args: list[str], env: dict[str, str], code: int, message: str
) -> None:
    """Fresh-user finding: a log pipeline read every line as JSON but the error."""
    done = subprocess.run(
        [STORMWATCH, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )
    assert done.returncode == code
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    error = lines[-1]
    assert (error["level"], error["message"], error["exit_code"]) == ("ERROR", message, code)
