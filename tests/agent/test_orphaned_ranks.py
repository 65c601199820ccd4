"""Ranks that outlive their launcher (issue 21), on real processes: the agent reports them
(``stormwatch_rank_orphaned_seconds``, a ``rank_orphaned`` event naming job, rank and pid),
node-wide kills reach them and their data-loader workers, and ``kill_torchrun`` records
the ranks it orphans and its revert leaves none of them running."""

from __future__ import annotations

import os
import signal
from typing import Any

import psutil

#: A rank with one data-loader worker (a child that sleeps); SIGTERM ends the rank only.
LOADER_RANK = (
    "import signal, subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(60)'])\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
    "while True:\n    time.sleep(60)\n"
)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _loaders(tools: Any, pids: list[int]) -> list[int]:
    """The data-loader worker of each rank (waits until each rank started one)."""

    def found() -> list[int] | None:
        children = [psutil.Process(p).children() for p in pids]
        return [c[0].pid for c in children] if all(children) else None

    return list(tools.wait_for(found))


def _ranks_seen(tools: Any, agent: Any, job: str, count: int) -> None:
    def seen() -> bool:
        ranks = tools.http("GET", agent.url + "/v1/ranks").json()["ranks"]
        return len([r for r in ranks if r["job"] == job and r["alive"]]) >= count

    tools.wait_for(seen)


def _orphaned_series(tools: Any, agent: Any, job: str) -> dict[str, float]:
    series = tools.scrape(agent.url).series("stormwatch_rank_orphaned_seconds", training_job=job)
    return {labels["rank"]: value for labels, value in series}


def _fault(tools: Any, agent: Any, method: str, path: str, body: Any = None) -> dict[str, Any]:
    reply = tools.http(method, agent.fault_url + path, body=body, token=tools.token)
    assert reply.status in (200, 201), reply.text
    return dict(reply.json())


def test_ranks_whose_launcher_died_are_reported_and_kill_node_processes_reaps_them(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0, 1], rank_code=LOADER_RANK)
    ranks = [launcher.wait_pid(0), launcher.wait_pid(1)]
    loaders = _loaders(tools, ranks)
    _ranks_seen(tools, agent, launcher.job, 2)
    os.kill(launcher.proc.pid, signal.SIGKILL)  # the launcher dies hard; its ranks run on
    assert launcher.proc.wait(10) == -signal.SIGKILL

    series = tools.wait_for(lambda: _orphaned_series(tools, agent, launcher.job))
    assert set(series) == {"0", "1"} and all(v >= 0 for v in series.values())
    events = tools.http("GET", agent.url + f"/v1/events?kind=rank_orphaned&job={launcher.job}")
    named = {(e["rank"], e["pid"]) for e in events.json()["events"]}
    assert named == {(0, ranks[0]), (1, ranks[1])}  # the ranks, not their loader workers
    assert all(_running(p) for p in ranks + loaders)

    body = {"id": "node-loss", "kind": "kill_node_processes", "job": launcher.job}
    record = _fault(tools, agent, "POST", "/v1/faults", body)
    assert sorted(record["details"]["orphans"]) == sorted(ranks)
    assert record["details"]["left"] == []
    assert not any(_running(p) for p in ranks + loaders)  # confirmed gone when it answered
    tools.wait_for(lambda: not _orphaned_series(tools, agent, launcher.job))


def test_kill_torchrun_records_the_ranks_it_orphans_and_its_revert_stops_them(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0, 1], rank_code=LOADER_RANK)
    ranks = [launcher.wait_pid(0), launcher.wait_pid(1)]
    loaders = _loaders(tools, ranks)
    _ranks_seen(tools, agent, launcher.job, 2)
    body = {"id": "kill-tr", "kind": "kill_torchrun", "job": launcher.job, "ttl_seconds": 60}
    record = _fault(tools, agent, "POST", "/v1/faults", body)
    assert launcher.proc.wait(10) == -signal.SIGKILL
    orphans = {(o["rank"], o["pid"]) for o in record["details"]["orphans"]}
    assert orphans == {(0, ranks[0]), (1, ranks[1])}
    assert all(_running(p) for p in ranks + loaders)  # the kill leaves them running
    # Rank 1 ends on its own before the revert (as its collective timeout would end it);
    # its loader worker, now init's, is still the job's and is stopped by the revert.
    psutil.Process(ranks[1]).terminate()
    tools.wait_for(lambda: not _running(ranks[1]))

    reverted = _fault(tools, agent, "DELETE", "/v1/faults/kill-tr")
    assert reverted["state"] == "reverted"
    removed = {o["rank"]: o["removed_by"] for o in reverted["details"]["revert"]["orphans"]}
    assert removed[0].startswith("the revert: SIG"), removed
    assert removed[1].startswith("exited before the revert"), removed
    assert not any(_running(p) for p in ranks + loaders)
    assert tools.job_processes(launcher.job) == []
