"""The agent asks a hung job's ranks for their dumps (:mod:`stormwatch.agent.watch.hangdumps`):
a real rank process started through ``stormwatch run``'s bootstrap answers, and so does
one that calls the API itself; a rank that does not answer is reported silent."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from stormwatch.agent.watch import hangdumps
from stormwatch.agent.watch.diagnostics import RankTarget, dump_dir
from stormwatch.telemetry.dump import read_all_dumps, read_dump
from stormwatch.telemetry.zerocode import BOOTSTRAP_DIR


def test_a_ranks_dump_folder_comes_from_its_command_line_else_its_environment() -> None:
    env = {"STORMWATCH_DUMP_DIR": "/d/env"}
    assert dump_dir(["stormwatch", "train", "--dump-dir", "/d/flag"], None, env) == Path("/d/flag")
    assert dump_dir(["stormwatch", "train", "--log-dir", "/l"], None, env) == Path("/l/dumps")
    assert dump_dir(["python", "train.py"], None, env) == Path("/d/env")
    assert dump_dir(["python", "train.py"], "/work", {}) is None


def _answered(rank: subprocess.Popen[bytes], targets: list[RankTarget]) -> hangdumps.HangCulprit:
    """Ask until the rank's watcher runs (requests from before it started are stale)."""
    deadline = time.monotonic() + 120
    while True:
        found = hangdumps.diagnose(targets, reason="hang of job dumps", now=time.time(), wait=2)
        if found.answered or time.monotonic() > deadline or rank.poll() is not None:
            return found


def test_a_rank_using_the_api_answers_too(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "SLURM_"))}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", STORMWATCH_DUMP_DIR=str(tmp_path))
    job = "import time, stormwatch.telemetry as swt; swt.init(job='api'); time.sleep(120)"
    rank = subprocess.Popen([sys.executable, "-c", job], env=env)
    try:
        target = RankTarget(("api", 0), rank.pid, (), None, {"STORMWATCH_DUMP_DIR": str(tmp_path)})
        found = _answered(rank, [target])
        assert (found.asked, found.answered) == ((0,), (0,))
        # The answer has a file of its own: the SIGTERM dump of the restart that follows a
        # hang does not replace the evidence taken while it lasted.
        rank.terminate()
        rank.wait(timeout=30)
        answer = tmp_path / f"rank0.attempt0.pid{rank.pid}.requested.json"
        at_exit = tmp_path / f"rank0.attempt0.pid{rank.pid}.json"
        assert read_dump(answer).reason.startswith("requested: ")
        assert read_dump(at_exit).reason.startswith("signal SIGTERM")
        assert [d.reason[:9] for d in read_all_dumps(tmp_path, 0)] == ["requested", "signal SI"]
    finally:
        rank.kill()
        rank.wait()


def test_a_zero_code_rank_answers_and_a_silent_one_is_reported(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "SLURM_"))}
    env.update(
        PYTHONPATH=str(BOOTSTRAP_DIR),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="2",
        TORCHELASTIC_RUN_ID="r",
        STORMWATCH_JOB="dumps",
        STORMWATCH_DUMP_DIR=str(tmp_path),
    )
    job = "import time, torch; time.sleep(120)"  # its telemetry starts with the torch import
    rank = subprocess.Popen([sys.executable, "-c", job], env=env)
    try:
        targets = [
            RankTarget(("dumps", 0), rank.pid, (), None, {"STORMWATCH_DUMP_DIR": str(tmp_path)})
        ]
        found = _answered(rank, targets)
        assert (found.asked, found.answered) == ((0,), (0,))
        assert found.culprit is None  # one dump, not inside a collective: nothing to compare
        silent = [
            *targets,
            RankTarget(("dumps", 1), 1, (), None, {"STORMWATCH_DUMP_DIR": str(tmp_path)}),
        ]
        found = hangdumps.diagnose(silent, reason="again", now=time.time(), wait=1.5)
        assert (found.asked, found.answered) == ((0, 1), (0,))
        unasked = [RankTarget(("dumps", 2), 1, ("python", "x.py"), None, {})]  # no folder
        assert hangdumps.diagnose(unasked, reason="x", now=time.time(), wait=1).asked == ()
    finally:
        rank.kill()
        rank.wait()


_FIRST_HANG_ON_THREE_THREADS = """
import importlib.abc, sys, threading, tempfile, time
from pathlib import Path
from stormwatch.agent.watch import diagnostics, hangdumps  # at start-up, as the agent

class SlowPackage(importlib.abc.MetaPathFinder):
    # finding stormwatch.telemetry takes 0.3 s: the window in which another thread, holding
    # its own submodule's lock, finds the package not imported yet (milliseconds in the
    # agent)
    def find_spec(self, name, path, target=None):
        if name != "stormwatch.telemetry":
            return None
        time.sleep(0.3)
        return None  # the next finder finds it

sys.meta_path.insert(0, SlowPackage())

folder = Path(tempfile.mkdtemp())
target = diagnostics.RankTarget(("j", 0), 1, ("python", "train.py"), None,
                                {"STORMWATCH_DUMP_DIR": str(folder)})
barrier, errors = threading.Barrier(3), []

def run(call):
    barrier.wait()
    try:
        call()
    except BaseException as exc:
        errors.append(repr(exc))

calls = (
    lambda: hangdumps.ask([], reason="hang", now=0.0),
    lambda: hangdumps.answers({}, since=0.0, wait=0.0),
    lambda: diagnostics._dump(target),
)
threads = [threading.Thread(target=run, args=(c,)) for c in calls]
for t in threads: t.start()
for t in threads: t.join()
print(errors or "ok")
"""


def test_fc10_the_first_hang_imports_the_dump_modules_on_several_threads_without_deadlock() -> None:
    """CI (cc13): the hang-diagnostics thread and the diagnostics writer imported the
    telemetry package's dump modules at once for the first time; CPython raised
    ``_DeadlockError`` and the zero-code hang was named by no culprit. Finding the package
    is slowed to 0.3 s here, so that the threads meet in its import every time."""
    import subprocess
    import sys

    for _ in range(3):  # a fresh interpreter each time: the first import is the race
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_HANG_ON_THREE_THREADS],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "ok", out.stdout + out.stderr
