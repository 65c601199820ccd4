"""What ``lab status`` prints for a lab that is down (lab.json of a stopped lab; nothing is
started)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from stormwatch.lab import LabConfig
from stormwatch.lab import cli as lab_cli
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import StateStore, plan_state
from stormwatch.lab.status import JobStatus, LabStatus, render_status

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))


def test_a_stopped_lab_says_it_is_not_running_and_how_to_start_it(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path / "run")
    state = plan_state(paths, LabConfig(nodes=2, prefix="swtdown"))
    state.phase = "down"  # what `lab down` leaves: lab.json, no process, no namespace
    StateStore(paths).save(state)

    out = subprocess.run(
        [STORMWATCH, "lab", "status", "--run-dir", str(paths.run_dir)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip

    assert out.returncode == 1, out.stderr  # as before: only a healthy lab exits 0
    assert out.stdout.splitlines() == [
        f"lab in {paths.run_dir}: down, not running; start it with "
        f"`stormwatch lab up --run-dir {paths.run_dir} --nodes 2 --prefix swtdown`"
    ]


def test_the_command_that_starts_a_stopped_lab_again_gives_its_configuration(
    tmp_path: Path,
) -> None:
    """The `lab up` line names the options the lab was started with, not the defaults'
    (which would start another lab); --json is as before, without the configuration."""
    paths = RunPaths.of(tmp_path / "run dir")
    config = LabConfig(
        nodes=5, prefix="swtdown2", slurm=False, scheduler="direct", prometheus_port=29090
    )
    state = plan_state(paths, config)
    state.phase = "down"
    StateStore(paths).save(state)
    env = {**os.environ, "COLUMNS": "300"}
    run = [STORMWATCH, "lab", "status", "--run-dir", str(paths.run_dir)]

    out = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env)
    shown = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=60, env=env)

    line = out.stdout.splitlines()[0]
    command = shlex.split(line.split("start it with `", 1)[1].removesuffix("`"))
    assert command[:3] == ["stormwatch", "lab", "up"], line
    ctx = lab_cli.up.make_context("up", command[3:])
    assert ctx.params["run_dir"] == paths.run_dir
    values = {k: v for k, v in ctx.params.items() if k not in ("run_dir", "force")}
    assert lab_cli._config(**values).model_dump(exclude={"startup_timeout"}) == config.model_dump(
        exclude={"startup_timeout"}
    )
    assert "config" not in json.loads(shown.stdout)


def test_a_stopped_lab_still_lists_the_jobs_it_ran(tmp_path: Path) -> None:
    job = JobStatus(
        name="baseline",
        running=False,
        stopped=True,
        started_at=time.time() - 60,
        exit_codes={"node0": None, "node1": None},
        job_dir=tmp_path / "jobs" / "baseline",
    )
    status = LabStatus(
        run_dir=tmp_path,
        phase="down",
        healthy=False,
        prometheus_url="http://127.0.0.1:19090",
        alertmanager_url="http://127.0.0.1:19093",
        responder_url="http://127.0.0.1:19095",
        nodes=[],
        services=[],
        jobs=[job],
        error="lab up: prometheus did not become ready",
        target_file=tmp_path / "target.yaml",
    )
    console = Console(record=True, width=200)

    render_status(status, console)

    text = console.export_text()
    assert text.startswith(f"lab in {tmp_path}: down, not running; start it with `stormwatch")
    assert "last error: lab up: prometheus did not become ready" in text
    assert "Jobs" in text and "baseline" in text and "stopped" in text
    assert "Nodes" not in text and "Services" not in text and "not healthy" not in text
    assert "target file" not in text


def test_every_lab_command_given_a_run_dir_without_a_lab_exits_2_naming_it(
    tmp_path: Path,
) -> None:
    """A mistaken --run-dir (or a lab never started) is the user's mistake, exit status 2, as
    from `chaos run` and `lab down`; `lab train`, `wait`, `stop` and `status` exited 1
    (fresh-user finding)."""
    missing, empty = tmp_path / "nolab", tmp_path / "empty"
    empty.mkdir()
    for args in (
        ["train", "--job", "j", "--steps", "3"],
        ["wait", "--job", "j"],
        ["stop", "--job", "j"],
        ["rejoin", "--job", "j", "--node", "node1"],
        ["status"],
    ):
        for run_dir in (missing, empty):
            out = subprocess.run(
                [STORMWATCH, "lab", *args, "--run-dir", str(run_dir)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert out.returncode == 2, (args, out.stderr)
            assert out.stderr.startswith(f"error: no lab in {run_dir}"), (args, out.stderr)
        assert not missing.exists(), "nothing is left behind"
        assert list(empty.iterdir()) == [], f"lab {args[0]} left {list(empty.iterdir())}"
