"""``stormwatch run``: the environment it gives a job, and the job's process as the caller sees
it (exit status, signals, mistakes), with the real command line and real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stormwatch.errors import ConfigError
from stormwatch.telemetry.zerocode import (
    BOOTSTRAP_DIR,
    RUN_ID_ENV,
    child_environ,
    resolve_command,
    resolve_settings,
)
from stormwatch.telemetry.zerocode.environ import prepare_folders

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))
#: Variables a developer's shell may set that change what the launcher resolves.
_RESOLVED = (
    "STORMWATCH_JOB",
    "SLURM_JOB_NAME",
    "STORMWATCH_METRICS_DIR",
    "STORMWATCH_AGENT_METRICS_DIR",
    "STORMWATCH_LOG_DIR",
    "STORMWATCH_DUMP_DIR",
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE",
    "SLURM_PROCID",
    "SLURM_STEP_ID",
    "RANK",
    "PYTHONPATH",
)


@pytest.fixture(autouse=True)
def _clean_environment() -> None:
    for name in _RESOLVED:
        os.environ.pop(name, None)


def _env(settings_env: dict[str, str] | None = None, **options: object) -> dict[str, str]:
    """The job's environment from the launcher's (``os.environ`` updated with ``settings_env``:
    the flight-recorder variables are read from it)."""
    os.environ.update(settings_env or {})
    environ = dict(os.environ)
    settings, _ = resolve_settings(["python", "train.py"], environ=environ, **options)  # type: ignore[arg-type]
    return child_environ(settings, environ)


def test_the_job_gets_the_bootstrap_first_on_its_path_and_every_folder(tmp_path: Path) -> None:
    env = _env(
        {"PYTHONPATH": "/opt/site:/opt/more"},
        job="llm",
        metrics_dir=tmp_path / "metrics",
        log_dir=tmp_path / "logs",
    )
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOTSTRAP_DIR), "/opt/site", "/opt/more"]
    assert (BOOTSTRAP_DIR / "sitecustomize.py").is_file()
    assert env["STORMWATCH_JOB"] == "llm"
    assert env["STORMWATCH_METRICS_DIR"] == str(tmp_path / "metrics")
    assert env["STORMWATCH_LOG_DIR"] == str(tmp_path / "logs")
    assert env["STORMWATCH_DUMP_DIR"] == str(tmp_path / "logs" / "dumps")  # the post-mortem's
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"  # the flight recorder, before any group exists
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "logs" / "dumps" / "nccl_trace_rank_")
    assert RUN_ID_ENV not in env  # not an srun task


def test_a_nested_launcher_does_not_put_the_bootstrap_twice(tmp_path: Path) -> None:
    once = _env(metrics_dir=tmp_path)
    twice = _env({"PYTHONPATH": once["PYTHONPATH"]}, metrics_dir=tmp_path)
    assert twice["PYTHONPATH"] == str(BOOTSTRAP_DIR)


def test_empty_path_entries_which_mean_the_current_folder_are_kept(tmp_path: Path) -> None:
    env = _env({"PYTHONPATH": ":/opt/site::"}, metrics_dir=tmp_path)
    assert env["PYTHONPATH"] == os.pathsep.join([str(BOOTSTRAP_DIR), "", "/opt/site", "", ""])
    assert _env({"PYTHONPATH": ""}, metrics_dir=tmp_path)["PYTHONPATH"] == str(BOOTSTRAP_DIR)


@pytest.mark.parametrize(
    ("environ", "options", "expected"),
    [
        ({}, {}, ("train", None)),
        ({"SLURM_JOB_NAME": "slurm"}, {}, ("slurm", None)),
        ({"SLURM_JOB_NAME": "slurm", "STORMWATCH_JOB": "env"}, {}, ("env", None)),
        ({"STORMWATCH_JOB": "env"}, {"job": "flag"}, ("flag", None)),
        ({"STORMWATCH_AGENT_METRICS_DIR": "/a"}, {}, ("train", "/a")),
        (
            {"STORMWATCH_AGENT_METRICS_DIR": "/a", "STORMWATCH_METRICS_DIR": "/m"},
            {},
            ("train", "/m"),
        ),
        ({"STORMWATCH_METRICS_DIR": "/m"}, {"metrics_dir": Path("/f")}, ("train", "/f")),
        ({"SLURMD_NODENAME": "gpu7"}, {"metrics_dir": Path("/x/%n/m")}, ("train", "/x/gpu7/m")),
    ],
)
def test_options_win_over_the_environment_which_wins_over_the_agents_setting(
    environ: dict[str, str], options: dict[str, object], expected: tuple[str, str | None]
) -> None:
    settings, warnings = resolve_settings(["true"], environ=environ, **options)  # type: ignore[arg-type]
    metrics = None if settings.metrics_dir is None else str(settings.metrics_dir)
    assert (settings.job, metrics) == expected
    # No metrics folder at all is said once, naming the ways to give one.
    assert bool(warnings) == (metrics is None and not Path("/run/stormwatch/metrics").is_dir())
    if warnings:
        assert "--metrics-dir" in warnings[0] and "STORMWATCH_AGENT_METRICS_DIR" in warnings[0]


def test_the_users_flight_recorder_settings_are_kept(tmp_path: Path) -> None:
    env = _env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}, metrics_dir=tmp_path)
    assert "TORCH_FR_BUFFER_SIZE" not in env and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "10"
    os.environ.pop("TORCH_NCCL_TRACE_BUFFER_SIZE")
    assert _env({"TORCH_FR_BUFFER_SIZE": "7"}, metrics_dir=tmp_path)["TORCH_FR_BUFFER_SIZE"] == "7"
    os.environ.pop("TORCH_FR_BUFFER_SIZE")
    off = _env(metrics_dir=tmp_path, flight_recorder_entries=0)
    assert "TORCH_FR_BUFFER_SIZE" not in off


@pytest.mark.parametrize(
    ("command", "environ", "marked"),
    [
        (["python", "train.py"], {"SLURM_PROCID": "3", "SLURM_STEP_ID": "0"}, True),
        (["torchrun", "train.py"], {"SLURM_PROCID": "3", "SLURM_STEP_ID": "0"}, False),
        (
            ["python", "-m", "torch.distributed.run", "t.py"],
            {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0"},
            False,
        ),
        (["python", "train.py"], {"SLURM_PROCID": "3"}, False),  # the batch script, no step
        (["python", "train.py"], {"SLURM_PROCID": "3", "SLURM_STEP_ID": "0", "RANK": "3"}, False),
    ],
)
def test_an_srun_task_that_is_a_rank_itself_is_marked_for_the_agent(
    command: list[str], environ: dict[str, str], marked: bool
) -> None:
    environ = {**environ, "SLURM_JOB_ID": "77"}
    settings, _ = resolve_settings(command, environ=environ)
    env = child_environ(settings, environ)
    assert env.get(RUN_ID_ENV) == ("77.0" if marked else None)


def test_a_folder_that_cannot_be_written_names_its_option(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    settings, _ = resolve_settings(["true"], environ={}, metrics_dir=blocker / "m")
    with pytest.raises(ConfigError, match=r"^--metrics-dir: .*cannot be written"):
        prepare_folders(settings)
    settings, _ = resolve_settings(["true"], environ={"STORMWATCH_LOG_DIR": str(blocker)})
    with pytest.raises(ConfigError, match=r"^STORMWATCH_LOG_DIR: "):
        prepare_folders(settings)


def test_a_command_is_looked_up_on_the_jobs_path(tmp_path: Path) -> None:
    assert resolve_command(["sh"], {"PATH": os.defpath}).endswith("/sh")
    with pytest.raises(ConfigError, match="not found on PATH"):
        resolve_command(["no-such-program-xyz"], {"PATH": os.defpath})
    script = tmp_path / "train.py"
    script.write_text("print()")
    with pytest.raises(ConfigError, match="is not an executable file"):
        resolve_command([str(script)], {})


# ------------------------------------------------------------------ the real command line
def _run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STORMWATCH, "run", *args], capture_output=True, text=True, timeout=60, **kwargs
    )  # type: ignore[call-overload,no-any-return]


def test_options_end_where_the_command_begins(tmp_path: Path) -> None:
    done = _run("--metrics-dir", str(tmp_path), "sh", "-c", "echo $STORMWATCH_JOB", "--job")
    assert (done.returncode, done.stdout.strip()) == (0, "train")  # --job was sh's
    typo = _run("--jbo", "x", "--", "true")
    assert typo.returncode == 2 and "Did you mean '--job'?" in typo.stderr


def test_the_commands_exit_status_is_the_launchers(tmp_path: Path) -> None:
    done = _run("--metrics-dir", str(tmp_path), "--", "sh", "-c", "exit 7")
    assert done.returncode == 7, done.stderr
    killed = _run("--metrics-dir", str(tmp_path), "--", "sh", "-c", "kill -KILL $$")
    assert killed.returncode == -signal.SIGKILL  # death by a signal, not a code


_WAITS_FOR_SIGTERM = """
import os, signal, sys, time
def stop(signum, frame):
    print("got", signal.Signals(signum).name, flush=True)
    sys.exit(42)
signal.signal(signal.SIGTERM, stop)
print("pid", os.getpid(), flush=True)
time.sleep(60)
"""


def test_a_signal_sent_to_the_launcher_reaches_the_command(tmp_path: Path) -> None:
    launcher = [STORMWATCH, "run", "--metrics-dir", str(tmp_path), "--"]
    proc = subprocess.Popen(
        [*launcher, sys.executable, "-c", _WAITS_FOR_SIGTERM],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["pid", str(proc.pid)]  # one process, exec'd
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 42
        assert proc.stdout.read().strip() == "got SIGTERM"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_command_starts_with_no_signal_ignored_that_python_ignores(tmp_path: Path) -> None:
    done = _run("--metrics-dir", str(tmp_path), "--", "grep", "SigIgn", "/proc/self/status")
    ignored = int(done.stdout.split()[1], 16)
    assert ignored & (1 << (signal.SIGPIPE - 1)) == 0, done.stdout  # `yes | head` works


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "error: no command to run: put the job's command after --"),
        (["--", "no-such-program-xyz", "a"], "error: command 'no-such-program-xyz' not found"),
        (["--", "{tmp}/data.txt"], "error: command '{tmp}/data.txt' is not an executable file"),
        (["--", "{tmp}/garbage"], "error: command '{tmp}/garbage' cannot be run (Exec format"),
        (["--metrics-dir", "/proc/no/such", "--", "true"], "error: --metrics-dir: '/proc/no/such'"),
        (["--job", "--", "true"], "error: --job: '--' is not a job name (the name is missing?)"),
    ],
)
def test_a_mistake_is_one_line_and_exit_status_2(
    args: list[str], message: str, tmp_path: Path
) -> None:
    (tmp_path / "data.txt").write_text("not a program")
    (tmp_path / "garbage").write_bytes(b"\x00\x01 not a program either")
    (tmp_path / "garbage").chmod(0o755)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--metrics-dir" not in args:
        args = ["--metrics-dir", str(tmp_path / "metrics"), *args]
    done = _run(*args)
    assert done.returncode == 2
    assert done.stderr.startswith(message.replace("{tmp}", str(tmp_path))), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_job_name_that_is_not_utf8_is_escaped_with_one_warning(tmp_path: Path) -> None:
    environ = {"STORMWATCH_JOB": "job\udcff", "STORMWATCH_METRICS_DIR": str(tmp_path)}
    settings, warnings = resolve_settings(["true"], environ=environ)
    assert settings.job == "job\\udcff"
    assert [w for w in warnings if "cannot be encoded as UTF-8" in w] == [
        "STORMWATCH_JOB: the job name cannot be encoded as UTF-8 (an environment that is not "
        "UTF-8?); using 'job\\\\udcff' (set the job name in UTF-8)"
    ]


def test_a_flight_recorder_beyond_the_largest_ring_is_refused(tmp_path: Path) -> None:
    done = _run("--metrics-dir", str(tmp_path), "--flight-recorder-entries", str(10**20), "true")
    assert done.returncode == 2
    assert "'--flight-recorder-entries': 100000000000000000000 is not in the range" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_python_command_with_no_launcher_is_told_how_to_get_ranks(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    done = _run("--metrics-dir", str(tmp_path / "metrics"), "--", sys.executable, str(script))
    assert done.returncode == 0 and "trained" in done.stdout  # it still runs
    assert "no launcher starts it (torchrun, srun)" in done.stderr, done.stderr
    assert f"stormwatch run -- torchrun --nproc-per-node 1 {script}" in done.stderr
    under_torchrun = resolve_settings(["torchrun", str(script)], environ={"RANK": "0"})[1]
    assert not [w for w in under_torchrun if "launcher" in w]
