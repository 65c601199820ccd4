"""Which ranks an agent claims (and may kill): metrics dir from environment or command line.

Regression: a trainer started as ``stormwatch train --metrics-dir D`` has no
``STORMWATCH_METRICS_DIR``, and every agent on the host claimed it; the fault
API then signalled another node's rank (and tried an unrelated job's pid).
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from stormwatch.agent.watch.proc_exits import UnavailableExits
from stormwatch.agent.watch.procs import is_torchrun_agent, metrics_dir_argument, rank_metrics_dir
from stormwatch.agent.watch.ranks import RankWatcher
from stormwatch.faults import FaultContext, FaultTargetNotFound
from stormwatch.faults.kinds.kill_rank import KillRank, KillRankRequest


def _ranks(tools: Any, agent: Any, job: str) -> dict[int, dict[str, Any]]:
    reply = tools.http("GET", agent.url + "/v1/ranks")
    assert reply.status == 200
    return {row["rank"]: row for row in reply.json()["ranks"] if row["job"] == job}


def _kill(tools: Any, agent: Any, rank: int, job: str, fault_id: str = "k") -> Any:
    body = {"id": fault_id, "kind": "kill_rank", "rank": rank, "job": job}
    return tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (["python", "-m", "stormwatch", "train", "--metrics-dir", "/r/n1/m"], "/r/n1/m"),
        (["/venv/bin/stormwatch", "train", "--steps", "5", "--metrics-dir=/r/n2/m"], "/r/n2/m"),
        (["stormwatch", "train", "--metrics-dir", "/a", "--metrics-dir", "/b"], "/b"),
        (["stormwatch", "--metrics-dir", "/before-train"], None),  # not a train command
        (["pytest", "tests/", "-k", "train"], None),
        (["stormwatch", "train", "--metrics-dir"], None),  # value missing
        (["stormwatch", "train", "--", "--metrics-dir", "/x"], None),
    ],
)
def test_metrics_dir_is_read_from_the_train_command_line(
    cmdline: list[str], expected: str | None
) -> None:
    assert metrics_dir_argument(cmdline) == expected


def test_rank_metrics_dir_prefers_the_command_line_and_resolves_relative_paths(
    tmp_path: Path,
) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "m")
    env = {"STORMWATCH_METRICS_DIR": "/elsewhere"}
    real = Path(os.path.realpath(tmp_path / "m"))
    assert (
        rank_metrics_dir(env, ["stormwatch", "train", "--metrics-dir=link"], str(tmp_path)) == real
    )
    assert rank_metrics_dir(env, ["python", "-c", "x"], None) == Path("/elsewhere")
    assert rank_metrics_dir({}, ["python", "-c", "x"], None) is None
    # A relative folder whose base is unknown matches no (absolute) agent folder.
    assert not rank_metrics_dir(
        {}, ["stormwatch", "train", "--metrics-dir", "m"], None
    ).is_absolute()


def test_rank_naming_its_metrics_dir_only_on_the_command_line_is_claimed_by_that_node_only(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path, metrics_dir: Path
) -> None:
    """Both agents claim unlabelled ranks (the default); the rank is labelled by argv."""
    ours = start_agent()
    other = tools.make_agent(tmp_path / "other-node")
    try:
        launcher = fake_torchrun(
            [0], write_metrics=False, rank_args=["train", "--metrics-dir", str(metrics_dir)]
        )
        pid = launcher.wait_pid(0)
        tools.wait_for(lambda: _ranks(tools, ours, launcher.job).get(0, {}).get("alive"))
        time.sleep(0.3)  # a few more scans of the other agent
        assert _ranks(tools, other, launcher.job) == {}
        refused = _kill(tools, other, 0, launcher.job)
        assert refused.status == 404, refused.text
        assert psutil.Process(pid).is_running()
        killed = _kill(tools, ours, 0, launcher.job)
        assert killed.status == 201, killed.text
        assert killed.json()["target_pid"] == pid
    finally:
        other.stop()


def test_unlabelled_rank_is_claimed_by_default_and_refused_with_no_claim(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    default = start_agent()
    lab = tools.make_agent(tmp_path / "lab-node", claim_unlabelled_ranks=False)
    try:
        launcher = fake_torchrun([0], write_metrics=False)
        pid = launcher.wait_pid(0)
        tools.wait_for(lambda: _ranks(tools, default, launcher.job).get(0, {}).get("pid") == pid)
        time.sleep(0.3)
        assert _ranks(tools, lab, launcher.job) == {}
        refused = _kill(tools, lab, 0, launcher.job)
        assert refused.status == 404 and "rank 0" in refused.json()["error"]
        assert psutil.Process(pid).is_running()
    finally:
        lab.stop()


def test_ownership_is_checked_again_right_before_the_signal(
    fake_torchrun: Any, tools: Any, tmp_path: Path, metrics_dir: Path
) -> None:
    """prepare() found the rank; by inject() it is not this node's: no signal, 404 with why."""
    launcher = fake_torchrun([0])
    pid = launcher.wait_pid(0)
    mine = RankWatcher(metrics_dir)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    theirs = RankWatcher(other_dir, claim_unlabelled=False)
    tools.wait_for(lambda: mine.scan() or mine.alive(0, launcher.job))
    fault = KillRank(KillRankRequest(id="x", kind="kill_rank", rank=0, job=launcher.job))
    fault.prepare(FaultContext(node="n", ranks=mine, is_launcher=is_torchrun_agent))
    with pytest.raises(FaultTargetNotFound, match="not this node's"):
        fault.inject(FaultContext(node="n", ranks=theirs, is_launcher=is_torchrun_agent))
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    info = mine.alive(0, launcher.job)[0][0]
    key = (launcher.job, 0)
    assert mine.check_owned(pid, info.started_at, key) is None
    assert "start time" in (mine.check_owned(pid, info.started_at - 100, key) or "")
    assert "not rank" in (mine.check_owned(pid, info.started_at, (launcher.job, 5)) or "")
    me = psutil.Process(os.getpid())  # e.g. an unrelated pytest job's pid
    assert mine.check_owned(me.pid, me.create_time(), key) is not None


#: A rank that runs a wrapper first, as ``python -m stormwatch run -- python train.py``
#: does: the wrapper (no metrics dir yet) lives past the watcher's settle time, then execs
#: the same interpreter (the same command name) with the rank's metrics dir set.
_EXECS_LATE = textwrap.dedent(
    r"""
    import os, sys, time
    stage = os.environ.get("STAGE", "0")
    code, folder = sys.argv[2], sys.argv[3]
    if stage == "0":
        env = dict(os.environ, STAGE="1")
        env.pop("STORMWATCH_METRICS_DIR", None)
        os.execve(sys.executable, [sys.executable, "-c", code, "x", code, folder], env)
    if stage == "1":
        time.sleep(2.5)
        env = dict(os.environ, STAGE="2", STORMWATCH_METRICS_DIR=folder)
        os.execve(sys.executable, [sys.executable, "-c", code, "x", code, folder], env)
    open(os.path.join(folder, "stage2"), "w").close()
    while True:
        time.sleep(60)
    """
)


def test_a_rank_that_execs_the_same_interpreter_after_settling_is_found(
    fake_torchrun: Any, metrics_dir: Path, tools: Any
) -> None:
    watcher = RankWatcher(
        metrics_dir, exits=UnavailableExits("test"), interval=0.2, claim_unlabelled=False
    )
    launcher = fake_torchrun(
        [0],
        rank_code=_EXECS_LATE,
        write_metrics=False,
        rank_args=["x", _EXECS_LATE, str(metrics_dir)],
    )
    try:
        launcher.wait_pid(0)
        watcher.start()
        tools.wait_for(lambda: (metrics_dir / "stage2").exists(), timeout=15)
        [rank] = tools.wait_for(watcher.ranks, timeout=10)
    finally:
        watcher.stop()
    assert (rank.job, rank.rank, rank.alive) == (launcher.job, 0, True)
