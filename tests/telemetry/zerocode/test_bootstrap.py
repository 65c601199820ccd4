"""The bootstrap ``sitecustomize`` that ``stormwatch run`` puts first on a job's PYTHONPATH, in
real Python processes: telemetry in a rank's main process only, once the job imports torch
(``hooked``: the post-import hook is waiting for it), nothing (not even an import) anywhere
else, and the job's own ``sitecustomize`` still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stormwatch.telemetry.zerocode import BOOTSTRAP_DIR
from stormwatch.telemetry.zerocode.rank import OWNER_ENV

#: What a process reports about itself: its session, and what it imported at start-up.
REPORT = textwrap.dedent(
    """
    import json, os, sys
    loaded = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("torch", "stormwatch")})
    session = None
    if "stormwatch" in sys.modules:
        if os.environ.get("REPORT_IMPORTS_TORCH"):
            import torch  # what a job does: the session starts then
        import stormwatch.telemetry as swt
        found = swt.session()
        session = None if found is None else {"rank": found.rank, "job": found.job}
    threads = sorted(t.name for t in __import__("threading").enumerate())
    hooked = any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)
    print(json.dumps({"loaded": loaded, "session": session, "threads": threads, "hooked": hooked,
                      "owner": os.environ.get("OWNER_ENV"), "pid": os.getpid(),
                      "shadowed": os.environ.get("SHADOWED_RAN")}))
    """
).replace("OWNER_ENV", OWNER_ENV)

RANK0 = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "r"}
#: The reporting process imports torch, as a job does, after looking at what start-up loaded.
TORCH = {"REPORT_IMPORTS_TORCH": "1"}


def _environ(tmp_path: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STORMWATCH_", "TORCHELASTIC_", "SLURM_", "PROMETHEUS_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PYTHONPATH")
    }
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR)
    env["STORMWATCH_JOB"] = "boot"
    env["STORMWATCH_METRICS_DIR"] = str(tmp_path / "metrics")
    env["STORMWATCH_DUMP_DIR"] = str(tmp_path / "dumps")
    env.update(extra or {})
    return env


def _report(argv: list[str], env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_process_that_is_not_a_rank_imports_nothing(tmp_path: Path) -> None:
    report = _report([sys.executable, "-c", REPORT], _environ(tmp_path))
    assert report["loaded"] == [] and report["session"] is None and report["owner"] is None


def test_a_ranks_main_process_starts_telemetry_when_the_job_imports_torch(
    tmp_path: Path,
) -> None:
    waiting = _report([sys.executable, "-c", REPORT], _environ(tmp_path, RANK0))
    assert waiting["loaded"] == ["stormwatch"]  # no torch at start-up
    assert waiting["hooked"] and waiting["session"] is None  # until the job imports it
    assert waiting["owner"] == str(waiting["pid"])
    report = _report([sys.executable, "-c", REPORT], _environ(tmp_path, {**RANK0, **TORCH}))
    assert report["session"] == {"rank": 0, "job": "boot"}
    assert not report["hooked"]  # the hook fired once and is gone
    assert "stormwatch-dump-requests" in report["threads"]  # the agent can ask for dumps
    assert (tmp_path / "metrics" / "rank0.done").exists()  # a clean end, for the agent


def test_processes_a_rank_starts_and_torchrun_itself_start_nothing(tmp_path: Path) -> None:
    child = [sys.executable, "-c", REPORT]
    parent = f"import subprocess, sys; subprocess.run({child!r}, check=True)"
    report = _report([sys.executable, "-c", parent], _environ(tmp_path, RANK0))
    assert not report["hooked"] and report["owner"] != str(report["pid"])
    launcher = tmp_path / "torchrun"  # a torchrun whose environment names a rank
    launcher.write_text(REPORT)
    report = _report([sys.executable, str(launcher)], _environ(tmp_path, RANK0))
    assert not report["hooked"] and report["owner"] is None


def test_a_slurm_task_marked_by_the_launcher_is_a_rank(tmp_path: Path) -> None:
    slurm = {"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}
    unmarked = _report([sys.executable, "-c", REPORT], _environ(tmp_path, slurm))
    assert not unmarked["hooked"] and unmarked["loaded"] == []
    marked = {**slurm, "STORMWATCH_RUN_ID": "9.0", **TORCH}
    report = _report([sys.executable, "-c", REPORT], _environ(tmp_path, marked))
    assert report["session"] == {"rank": 2, "job": "boot"}


@pytest.mark.parametrize("fails", [False, True])
def test_the_sitecustomize_it_shadows_still_runs(tmp_path: Path, fails: bool) -> None:
    theirs = tmp_path / "site"
    theirs.mkdir()
    body = "import os\nos.environ['SHADOWED_RAN'] = 'yes'\n"
    (theirs / "sitecustomize.py").write_text(body + ("raise RuntimeError('broken site')\n" * fails))
    env = _environ(tmp_path, RANK0)
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), str(theirs)])
    done = subprocess.run(
        [sys.executable, "-c", REPORT], env=env, capture_output=True, text=True, timeout=120
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["shadowed"] == "yes"
    assert report["hooked"]  # ours ran after theirs
    if fails:
        assert "Error in sitecustomize" in done.stderr and "broken site" in done.stderr


def test_a_python_without_stormwatch_says_so_once_and_runs_the_job(tmp_path: Path) -> None:
    base = getattr(sys, "_base_executable", sys.executable)  # this venv's interpreter, bare
    env = _environ(tmp_path, RANK0)
    done = subprocess.run(
        [base, "-c", "print('ran')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    if "cannot import stormwatch" not in done.stderr and done.stdout.strip() == "ran":
        pytest.skip(f"{base} can import stormwatch: no bare interpreter to try")
    assert done.returncode == 0 and done.stdout.strip() == "ran"
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"stormwatch run: {base} cannot import stormwatch (ModuleNotFoundError")


#: A job with no API call: a one-rank gloo group, then it waits to be read before it ends.
GROUP_UP = textwrap.dedent(
    """
    import os, sys, time
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"],
                            rank=0, world_size=1)
    print("group up", flush=True)
    sys.stdin.readline()  # until the test has read the log
    dist.destroy_process_group()
    """
)


def test_a_job_without_api_calls_gets_its_start_record_when_its_group_is_up(
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _environ(tmp_path, {**RANK0, "PORT": str(port)})
    env["STORMWATCH_LOG_DIR"] = str(tmp_path / "logs")
    log = tmp_path / "logs" / "rank0.jsonl"
    with subprocess.Popen(
        [sys.executable, "-c", GROUP_UP], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    ) as job:  # fmt: skip
        try:
            assert job.stdout is not None and job.stdin is not None
            assert job.stdout.readline().strip() == "group up"
            lines = log.read_text().splitlines() if log.exists() else []
            assert [json.loads(line)["event"] for line in lines] == ["start"], lines  # not at exit
            job.stdin.write("\n")
            job.stdin.flush()
            assert job.wait(timeout=60) == 0
        finally:
            job.kill()
    assert [json.loads(line)["event"] for line in log.read_text().splitlines()] == [
        "start",
        "done",
    ]
