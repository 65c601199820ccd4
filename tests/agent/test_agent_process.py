"""``stormwatch agent run`` as a real process: scraped over HTTP, stopped by signals, user errors."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_agent_process_serves_metrics_and_stops_cleanly_on_signal(
    agent_process: Any, tools: Any, sig: int
) -> None:
    proc = agent_process("--sample-interval", "0.2")
    scrape = tools.scrape(proc.url)
    assert (
        scrape.value("stormwatch_agent_info", node="node-proc", gpu_backend="sim", version="0.1.0")
        == 1
    )
    assert scrape.value("DCGM_FI_DEV_GPU_UTIL", gpu="1") is not None
    assert all(value == 1 for _, value in scrape.series("stormwatch_collector_up"))
    # The background sampler keeps the snapshot fresh (0.2 s interval).
    energy = scrape.value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0")
    tools.wait_for(
        lambda: (
            tools.scrape(proc.url).value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0") > energy
        )
    )
    assert tools.scrape(proc.url).value("stormwatch_gpu_snapshot_age_seconds") < 5
    health = tools.http("GET", proc.url + "/healthz").json()
    assert (
        health["status"] == "ok"
        and health["node"] == "node-proc"
        and health["gpu_backend"] == "sim"
    )
    started = time.monotonic()
    assert proc.stop(sig) == 0
    assert time.monotonic() - started < 10
    log = proc.log.read_text()
    assert "stopping" in log and "Traceback" not in log


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--listen", "nonsense"], "listen"),
        (["--listen", "127.0.0.1:99999"], "port"),
        (["--sample-interval", "0"], "sample_interval"),
        (["--node", "bad name!"], "node"),
        (
            ["--token-file", "/nonexistent/agent.token", "--fault-api-listen", "127.0.0.1:0"],
            "token_file",
        ),
        (["--metrics-dir", "/nonexistent-stormwatch/metrics"], "--metrics-dir"),
    ],
)
def test_user_errors_exit_2_naming_the_field_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    from stormwatch.cli import main

    with pytest.raises(SystemExit) as exited:
        main(
            [
                "agent",
                "run",
                "--metrics-dir",
                str(tmp_path / "m"),
                "--state-dir",
                str(tmp_path / "s"),
                "--gpu-backend",
                "sim",
                "--listen",
                "127.0.0.1:0",
                *args,
            ]
        )
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert needle in err and "Traceback" not in err


def test_taken_port_is_a_user_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [
                STORMWATCH,
                "agent",
                "run",
                "--metrics-dir",
                str(tmp_path / "m"),
                "--state-dir",
                str(tmp_path / "s"),
                "--gpu-backend",
                "sim",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2 and "listen" in out.stderr and "Traceback" not in out.stderr, (
        out.stderr
    )


def test_empty_token_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    out = _run(tmp_path, "--token-file", str(empty), "--fault-api-listen", "127.0.0.1:0")
    assert out.returncode == 2 and "empty" in out.stderr, out.stderr


def test_agent_run_help_lists_the_contract_options() -> None:
    out = subprocess.run(
        [STORMWATCH, "agent", "run", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    for option in (
        "--listen",
        "--node",
        "--metrics-dir",
        "--gpu-backend",
        "--sim-gpus",
        "--token-file",
        "--state-dir",
        "--sample-interval",
        "--disable-collector",
        "--claim-unlabelled-ranks",
        "--no-claim-unlabelled-ranks",
    ):
        assert option in out.stdout, option


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            STORMWATCH,
            "agent",
            "run",
            "--metrics-dir",
            str(tmp_path / "m"),
            "--state-dir",
            str(tmp_path / "s"),
            "--gpu-backend",
            "sim",
            "--listen",
            "127.0.0.1:0",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_binary_token_file_is_a_clear_user_error(tmp_path: Path) -> None:
    binary = tmp_path / "binary.token"
    binary.write_bytes(b"\xff\xfe")
    out = _run(tmp_path, "--token-file", str(binary), "--fault-api-listen", "127.0.0.1:0")
    assert out.returncode == 2, out.stderr
    assert "must hold an ASCII token" in out.stderr and "Traceback" not in out.stderr


def test_missing_metrics_dir_parent_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    """--metrics-dir /nonexistent/x used to mkdir -p at the filesystem root."""
    missing = tmp_path / "no-such-parent" / "metrics"
    out = subprocess.run(
        [STORMWATCH, "agent", "run", "--metrics-dir", str(missing), "--state-dir",
         str(tmp_path / "s"), "--gpu-backend", "sim", "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "--metrics-dir" in out.stderr, out.stderr
    assert str(missing.parent) in out.stderr and "Traceback" not in out.stderr
    assert not missing.parent.exists()


def test_metrics_dir_leaf_is_created_when_its_parent_exists(
    start_agent: Any, tmp_path: Path
) -> None:
    start_agent(metrics_dir=tmp_path / "fresh-metrics")
    assert (tmp_path / "fresh-metrics").is_dir()


def test_second_agent_on_the_same_state_dir_is_refused_naming_dir_and_pid(
    start_agent: Any, tmp_path: Path, tools: Any
) -> None:
    import os

    from stormwatch.agent.errors import AgentConfigError

    first = start_agent(state_dir=tmp_path / "s")
    # Another process: the CLI exits 2 with the state dir and the holder's pid.
    out = _run(tmp_path)
    assert out.returncode == 2, out.stderr
    assert str(tmp_path / "s") in out.stderr and f"pid {os.getpid()}" in out.stderr
    assert "Traceback" not in out.stderr
    # The same process (another agent object) is refused too, and nothing is torn down.
    with pytest.raises(AgentConfigError, match="in use by another agent"):
        tools.make_agent(tmp_path / "second", state_dir=tmp_path / "s", metrics_dir=tmp_path / "m")
    assert tools.http("GET", first.url + "/healthz").status == 200
    first.stop()
    # Released on stop: the state dir can be used again.
    again = tools.make_agent(tmp_path / "third", state_dir=tmp_path / "s")
    again.stop()
