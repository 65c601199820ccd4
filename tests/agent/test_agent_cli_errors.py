"""``stormwatch agent run`` user errors: one line naming the option and the fix, exit 2,
no traceback (the metrics dir, NaN, an empty --node, the options' own names)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from stormwatch.agent import AgentConfigError
from stormwatch.agent.cli import run as run_command
from stormwatch.agent.config import AgentConfig, ensure_metrics_dir, option_of


def _main(tmp_path: Path, *args: str) -> int:
    from stormwatch.cli import main

    with pytest.raises(SystemExit) as exited:
        main(
            [
                "agent",
                "run",
                "--state-dir",
                str(tmp_path / "s"),
                "--gpu-backend",
                "sim",
                "--listen",
                "127.0.0.1:0",
                *args,
            ]
        )
    assert isinstance(exited.value.code, int)
    return exited.value.code


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--rendezvous-probe-interval", "0"], ["--rendezvous-probe-interval", "greater than 0"]),
        (["--sample-interval", "nan"], ["--sample-interval", "finite number"]),
        (["--hang-factor", "inf"], ["--hang-factor", "finite number"]),
        (["--node", ""], ["--node", "must not be empty"]),
        (["--metrics-dir", "/proc"], ["--metrics-dir", "cannot create files in /proc"]),
        (["--metrics-dir", "/sys/kernel"], ["--metrics-dir", "cannot create files in /sys"]),
    ],
)
def test_user_errors_name_the_option_exit_2_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needles: list[str]
) -> None:
    if "--metrics-dir" not in args:
        args = ["--metrics-dir", str(tmp_path / "m"), *args]
    code = _main(tmp_path, *args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert all(needle in err for needle in needles), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_missing_metrics_dir_is_created_and_said_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fresh = tmp_path / "fresh"
    with caplog.at_level(logging.WARNING, logger="stormwatch.agent.config"):
        ensure_metrics_dir(fresh)
    assert fresh.is_dir() and list(fresh.iterdir()) == []
    assert f"created {fresh}" in caplog.text and "--metrics-dir" in caplog.text
    caplog.clear()
    ensure_metrics_dir(fresh)  # there now: nothing to say
    assert caplog.text == ""


def test_a_metrics_dir_without_room_for_files_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match=r"--metrics-dir.*cannot create files in /proc"):
        ensure_metrics_dir(Path("/proc"))
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(AgentConfigError, match=r"--metrics-dir.*is not a folder"):
        ensure_metrics_dir(a_file)


def test_every_config_field_with_an_option_names_a_real_option() -> None:
    options = {opt for param in run_command.params for opt in param.opts}
    for field in AgentConfig.model_fields:
        option = option_of(field)
        assert option is None or option in options, (field, option)
    assert option_of("rank_scan_interval") is None and option_of("surprise") is None
