"""Rank watcher and trainer files, with real rank processes under a process named torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stormwatch.agent import FakeNvml
from stormwatch.agent.watch.ranks import is_torchrun_agent
from stormwatch.contracts.rank_env import rank_env


def _ranks(tools: Any, agent: Any, job: str) -> dict[int, dict[str, Any]]:
    """Rows of ``job`` only: other people's torchrun jobs may run on this machine."""
    reply = tools.http("GET", agent.url + "/v1/ranks")
    assert reply.status == 200
    return {row["rank"]: row for row in reply.json()["ranks"] if row["job"] == job}


@pytest.mark.parametrize(
    ("name", "cmdline", "expected"),
    [
        ("torchrun", [], True),
        (
            "python3",
            ["/venv/bin/python3", "/venv/bin/torchrun", "--nproc-per-node=2", "t.py"],
            True,
        ),
        ("python3", ["python3", "-m", "torch.distributed.run", "t.py"], True),
        ("python3", ["python3", "-m", "torch.distributed.launch", "t.py"], True),
        ("python3", ["python3", "train.py", "--note", "torchrun"], False),
        ("bash", ["bash", "-c", "sleep 1"], False),
    ],
)
def test_torchrun_agents_are_recognised(name: str, cmdline: list[str], expected: bool) -> None:
    assert is_torchrun_agent(name, cmdline) is expected


def test_rank_env_needs_torchrun_variables_and_prefers_stormwatch_job() -> None:
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "r1"}
    parsed = rank_env(env)
    assert parsed is not None and parsed.key == ("r1", 3) and parsed.local_rank == 1
    assert rank_env({**env, "STORMWATCH_JOB": "baseline"}).key == ("baseline", 3)
    assert rank_env({k: v for k, v in env.items() if k != "TORCHELASTIC_RUN_ID"}) is None
    assert rank_env({**env, "RANK": "x"}) is None


def test_ranks_under_torchrun_are_found_and_others_ignored(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0, 1], world_size=4)
    pids = {rank: launcher.wait_pid(rank) for rank in (0, 1)}
    # A process with a rank's environment but no torchrun parent is not a rank.
    env = {
        **os.environ,
        "RANK": "7",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "8",
        "TORCHELASTIC_RUN_ID": "x",
    }
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        # Found, and their first steps (written after start-up) are read from the files.
        tools.wait_for(
            lambda: (
                [row["last_step"] for row in _ranks(tools, agent, launcher.job).values()] == [3, 3]
            )
        )
        time.sleep(0.3)  # a few more scans: the stray must still be ignored
        rows = _ranks(tools, agent, launcher.job)
    finally:
        stray.kill()
        stray.wait()
    assert set(rows) == {0, 1}
    for rank in (0, 1):
        row = rows[rank]
        assert row["pid"] == pids[rank] and row["alive"] is True
        assert row["job"] == launcher.job and row["local_rank"] == rank and row["world_size"] == 4
        assert row["last_step"] == 3
    scrape = tools.scrape(agent.url)
    assert scrape.value("stormwatch_rank_up", training_job=launcher.job, rank="0") == 1
    assert (
        scrape.value("stormwatch_rank_unexpected_exits_total", training_job=launcher.job, rank="1")
        == 0
    )


def test_ranks_of_another_node_are_not_this_nodes(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    """The lab shares one PID namespace: a node owns the ranks writing to its metrics dir."""
    agent = start_agent()
    other_dir = tmp_path / "other-node-metrics"
    other_dir.mkdir()
    ours = fake_torchrun([0])
    theirs = fake_torchrun([1], write_metrics=False, env={"STORMWATCH_METRICS_DIR": str(other_dir)})
    theirs.wait_pid(1)
    ours.wait_pid(0)
    tools.wait_for(lambda: _ranks(tools, agent, ours.job).get(0, {}).get("alive"))
    time.sleep(0.3)
    assert _ranks(tools, agent, theirs.job) == {}
    reply = tools.http(
        "POST",
        agent.fault_url + "/v1/faults",
        body={"id": "x", "kind": "kill_rank", "rank": 1, "job": theirs.job},
        token=tools.token,
    )
    assert reply.status == 404


def test_fc01_dead_rank_gauges_disappear(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    agent = start_agent()
    release = tmp_path / "release"
    launcher = fake_torchrun([0, 1], env={"FAKE_RANK_EXIT_ON": str(release)})
    launcher.wait_pid(0)

    def both_ranks_reporting() -> Any:
        scrape = tools.scrape(agent.url)
        ok = all(
            scrape.value("stormwatch_train_step", training_job=launcher.job, rank=r) == 3
            and scrape.value(
                "stormwatch_rank_last_progress_timestamp_seconds", training_job=launcher.job, rank=r
            )
            for r in "01"
        )
        return scrape if ok else None

    before = tools.wait_for(both_ranks_reporting)
    heartbeat = before.value(
        "stormwatch_train_last_step_timestamp_seconds", training_job=launcher.job, rank="0"
    )
    assert (
        before.value(
            "stormwatch_rank_last_progress_timestamp_seconds", training_job=launcher.job, rank="0"
        )
        == heartbeat
    )
    assert not [lab for lab, _ in before.series("stormwatch_train_step") if "pid" in lab]

    release.touch()  # both ranks exit with code 1, no done marker

    def rank_gauges_gone() -> Any:
        # Both exits noticed and both ranks' live gauges dropped (one scrape reads the
        # watcher's state and the trainer's files at slightly different moments).
        scrape = tools.scrape(agent.url)
        gone = not scrape.series("stormwatch_train_step", training_job=launcher.job)
        down = all(
            scrape.value("stormwatch_rank_up", training_job=launcher.job, rank=rank) == 0
            for rank in "01"
        )
        return scrape if gone and down else None

    after = tools.wait_for(rank_gauges_gone)
    # Current-state gauges are gone; counters and histograms stay.
    for name in ("stormwatch_train_loss", "stormwatch_train_last_step_timestamp_seconds"):
        assert after.series(name, training_job=launcher.job) == [], name
    for rank in "01":
        assert (
            after.value("stormwatch_train_steps_total", training_job=launcher.job, rank=rank) == 3
        )
        assert (
            after.value(
                "stormwatch_train_step_duration_seconds_count", training_job=launcher.job, rank=rank
            )
            == 3
        )
        assert after.value("stormwatch_rank_up", training_job=launcher.job, rank=rank) == 0
        assert (
            after.value(
                "stormwatch_rank_unexpected_exits_total", training_job=launcher.job, rank=rank
            )
            == 1
        )
    # The last heartbeat is kept, so it goes stale for the "no progress" alert.
    assert (
        after.value(
            "stormwatch_rank_last_progress_timestamp_seconds", training_job=launcher.job, rank="0"
        )
        == heartbeat
    )
    assert not list(agent.config.metrics_dir.glob("gauge_live*.db"))


def test_clean_exit_with_done_marker_is_not_unexpected(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    agent = start_agent()
    release = tmp_path / "release"
    env = {"FAKE_RANK_EXIT_ON": str(release), "FAKE_RANK_DONE": "1", "FAKE_RANK_EXIT_CODE": "0"}
    launcher = fake_torchrun([0], env=env)
    launcher.wait_pid(0)
    tools.wait_for(lambda: _ranks(tools, agent, launcher.job).get(0, {}).get("alive"))
    release.touch()
    tools.wait_for(
        lambda: 0 not in _ranks(tools, agent, launcher.job)
    )  # finished ranks are forgotten
    scrape = tools.scrape(agent.url)
    assert (
        scrape.value("stormwatch_rank_unexpected_exits_total", training_job=launcher.job, rank="0")
        == 0
    )
    assert (
        scrape.series("stormwatch_rank_last_progress_timestamp_seconds", training_job=launcher.job)
        == []
    )
    assert scrape.value("stormwatch_train_steps_total", training_job=launcher.job, rank="0") == 3


def test_restarted_rank_is_counted_and_refreshes_progress(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    agent = start_agent()
    release = tmp_path / "release"
    launcher = fake_torchrun([0], restart=True, env={"FAKE_RANK_EXIT_ON": str(release)})
    first = launcher.wait_pid(0)
    tools.wait_for(
        lambda: tools.scrape(agent.url).value(
            "stormwatch_rank_last_progress_timestamp_seconds", training_job=launcher.job, rank="0"
        )
    )
    old = tools.scrape(agent.url).value(
        "stormwatch_rank_last_progress_timestamp_seconds", training_job=launcher.job, rank="0"
    )
    time.sleep(0.05)
    release.touch()
    second = launcher.wait_pid(0, count=2)
    assert second != first
    tools.wait_for(lambda: _ranks(tools, agent, launcher.job).get(0, {}).get("pid") == second)

    def refreshed() -> Any:
        scrape = tools.scrape(agent.url)
        stamp = scrape.value(
            "stormwatch_rank_last_progress_timestamp_seconds", training_job=launcher.job, rank="0"
        )
        return scrape if stamp is not None and stamp > old else None

    scrape = tools.wait_for(refreshed)
    assert scrape.value("stormwatch_rank_up", training_job=launcher.job, rank="0") == 1
    assert (
        scrape.value("stormwatch_rank_unexpected_exits_total", training_job=launcher.job, rank="0")
        == 1
    )
    assert _ranks(tools, agent, launcher.job)[0]["restart_count"] == 1


def test_fc06_gpu_process_entries_are_checked_before_blaming_a_rank(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    fake = FakeNvml(1)
    agent = start_agent(fake)
    launcher = fake_torchrun([0, 1])
    rank0, rank1 = launcher.wait_pid(0), launcher.wait_pid(1)
    tools.wait_for(lambda: len(_ranks(tools, agent, launcher.job)) == 2)
    total = fake.gpus[0].memory_total
    not_a_rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake.set_processes(
            0,
            [
                (rank0, 3 * 2**30),  # good
                (6498025472, 9980),  # FC-06: pid and memory swapped -> no such pid
                (rank1, total + 1),  # more memory than the GPU has
                (not_a_rank.pid, 2**30),  # exists, but not under torchrun
                (2**22 + 12345, 2**20),  # above pid_max: does not exist
            ],
        )
        agent.sample()
        scrape = tools.scrape(agent.url)
    finally:
        not_a_rank.kill()
        not_a_rank.wait()
    assert scrape.series("stormwatch_rank_gpu_memory_used_bytes") == [
        ({"training_job": launcher.job, "rank": "0", "gpu": "0"}, float(3 * 2**30))
    ]
    assert scrape.value("stormwatch_gpu_processes_rejected", gpu="0", reason="no_such_pid") == 2
    assert (
        scrape.value("stormwatch_gpu_processes_rejected", gpu="0", reason="memory_exceeds_total")
        == 1
    )
    assert scrape.value("stormwatch_gpu_processes_rejected", gpu="0", reason="not_a_rank") == 1
