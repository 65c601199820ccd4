"""Processes the rank starts are not the rank: a spawn data-loader worker or a helper that
inherits RANK/STORMWATCH_* and calls init() gets a disabled session, and a forked Pool
worker neither signals the rank nor writes its dump (real processes, real signals)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stormwatch.telemetry.dump import rank_dump_paths

#: The rank inits, then a spawn worker (a helper) that inherits the environment inits too.
SPAWN = """
import multiprocessing as mp, os, sys
import stormwatch.telemetry as swt

def worker():
    s = swt.init(collectives=False)
    swt.step(1)
    s.dump("the worker's")
    swt.shutdown()

if __name__ == "__main__":
    swt.init(collectives=False)
    swt.step(1)
    p = mp.get_context("spawn").Process(target=worker)
    p.start(); p.join()
    print("worker", p.exitcode, os.path.exists(sys.argv[1] + "/m/rank0.done"), flush=True)
    swt.step(2)
    raise RuntimeError("the rank fails: no done marker")
"""

#: The rank uses a fork Pool, then a forked worker gets SIGTERM (as Pool.terminate() sends).
POOL = """
import multiprocessing as mp, os, signal, time
import stormwatch.telemetry as swt

def square(x):
    return x * x

if __name__ == "__main__":
    s = swt.init(collectives=False)
    fork = mp.get_context("fork")
    with fork.Pool(2) as pool:
        pool.map(square, range(8))
    worker = fork.Process(target=time.sleep, args=(60,))
    worker.start()
    time.sleep(0.5)
    os.kill(worker.pid, signal.SIGTERM)
    worker.join(10)
    print("worker", worker.exitcode, flush=True)
    time.sleep(2.0)  # the wakeup thread's grace: a wrongly signalled rank would end here
    print("signalled", s._signalled, flush=True)
"""


def _environ(tmp_path: Path) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STORMWATCH_")}
    environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        STORMWATCH_METRICS_DIR=str(tmp_path / "m"),
        STORMWATCH_LOG_DIR=str(tmp_path / "l"),
        STORMWATCH_DUMP_DIR=str(tmp_path / "d"),
    )
    return environ


def test_a_spawn_worker_calling_init_writes_nothing(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SPAWN)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        env=_environ(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "worker 0 False" in done.stdout, done.stdout + done.stderr
    assert "a process the rank" in done.stderr  # the worker's one warning
    assert not (tmp_path / "m" / "rank0.done").exists()
    assert not rank_dump_paths(tmp_path / "d", 0)  # the worker's dump was not written
    records = [
        json.loads(line) for line in (tmp_path / "l" / "rank0.jsonl").read_text().splitlines()
    ]
    pids = {r.get("pid") for r in records} - {None}
    assert pids <= {records[0].get("pid")}, pids
    assert [r["event"] for r in records].count("start") == 1
    assert "done" not in [r["event"] for r in records]


def test_a_fork_pool_worker_signalled_does_not_signal_the_rank(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(POOL)
    done = subprocess.run(
        [sys.executable, str(script)],
        env=_environ(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "worker -15" in done.stdout, done.stdout  # the default action, as without us
    assert "signalled False" in done.stdout, done.stdout + done.stderr
    assert not rank_dump_paths(tmp_path / "d", 0), done.stderr
    assert (tmp_path / "m" / "rank0.done").exists()


def test_a_nearly_full_metrics_folder_turns_metrics_off_and_training_runs_on(
    tmp_path: Path,
) -> None:
    """prometheus-client mmaps its files: on a full tmpfs a write is a SIGBUS."""
    folder = tmp_path / "small"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(folder)], check=True)
    try:
        environ = {**_environ(tmp_path), "STORMWATCH_METRICS_DIR": str(folder)}
        code = (
            "import stormwatch.telemetry as swt\nswt.init(collectives=False)\n"
            "for step in range(1, 201):\n    swt.step(step, loss=1.0, tokens=step)\n"
            "print('steps done', flush=True)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        subprocess.run(["umount", str(folder)], check=False)
    assert done.returncode == 0, done.stderr
    assert "steps done" in done.stdout
    assert f"metrics_dir={str(folder)!r} has" in done.stderr
    assert done.stderr.count("metrics are off") == 1


#: A rank whose job name came from an environment that is not UTF-8, and the node agent's
#: trainer collector reading the folder it shares with another job's rank.
SURROGATE_JOB = """
import sys
from pathlib import Path
import stormwatch.telemetry as swt
from stormwatch.agent.collectors.base import CollectorSet
from stormwatch.agent.collectors.trainer import TrainerCollector
from stormwatch.agent.watch.folder import TrainerFolder
swt.init(collectives=False)
swt.step(1)
text = CollectorSet([TrainerCollector(TrainerFolder(Path(sys.argv[1])))]).render().decode()
print([line for line in text.splitlines() if line.startswith("stormwatch_collector_up")])
"""


def test_a_job_name_that_is_not_utf8_is_escaped_and_the_agent_still_reads_it(
    tmp_path: Path,
) -> None:
    environ = {**_environ(tmp_path), "STORMWATCH_JOB": "job\udcff"}  # b"job\xff" in the env
    done = subprocess.run(
        [sys.executable, "-c", SURROGATE_JOB, str(tmp_path / "m")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("cannot be encoded as UTF-8") == 1, done.stderr
    assert "using 'job\\\\udcff'" in done.stderr, done.stderr
    assert 'stormwatch_collector_up{collector="trainer"} 1.0' in done.stdout, done.stdout
