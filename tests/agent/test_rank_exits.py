"""Item 7: a rank's exit code or killing signal, although the agent is not its parent.

Real processes throughout: exits of another process's children are read from the
Linux proc connector; the fallback is exercised in a user + network namespace,
where the connector cannot be reached.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from stormwatch.agent.watch.proc_exits import UnavailableExits, open_exit_source
from stormwatch.agent.watch.ranks import RankWatcher

GRANDCHILDREN = textwrap.dedent(
    """
    import subprocess, sys, time
    three = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    print(three.pid, flush=True)
    three.wait()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(sleeper.pid, flush=True)
    sys.stdin.readline()  # the test kills the sleeper, then lets us reap it
    sleeper.wait()
    """
)


def test_exits_of_another_process_s_children_carry_code_and_signal() -> None:
    source = open_exit_source()
    if not source.available:
        pytest.skip(f"no proc connector on this machine: {source.reason}")
    started = time.time()
    with subprocess.Popen(
        [sys.executable, "-c", GRANDCHILDREN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as parent:
        try:
            assert parent.stdout is not None and parent.stdin is not None
            three = int(parent.stdout.readline())
            sleeper = int(parent.stdout.readline())
            os.kill(sleeper, signal.SIGKILL)  # we are not its parent: its parent reaps it
            parent.stdin.write("\n")
            parent.stdin.flush()
            assert parent.wait(30) == 0
            exited = source.lookup(three, since=started, wait=5)
            killed = source.lookup(sleeper, since=started, wait=5)
        finally:
            parent.kill()
            source.close()
    assert exited is not None and (exited.code, exited.signal, exited.returncode) == (3, None, 3)
    assert killed is not None and (killed.code, killed.signal, killed.returncode) == (None, 9, -9)
    assert source.lookup(three, since=time.time() + 60) is None, "an older exit of a reused pid"


def test_without_the_proc_connector_the_reason_is_logged_and_exits_are_unknown() -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed")
    code = (
        "import logging; logging.basicConfig(level=logging.WARNING);"
        "from stormwatch.agent.watch.proc_exits import open_exit_source;"
        "s = open_exit_source(); print(s.available, s.lookup(1, since=0, wait=0.1))"
    )
    done = subprocess.run(
        [unshare, "--user", "--map-root-user", "--net", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"cannot create user namespaces here: {done.stderr.strip()}")
    assert done.stdout.split() == ["False", "None"], done.stderr
    assert "proc connector unavailable" in done.stderr
    assert "only known for ranks seen as zombies" in done.stderr


def _ranks(tools: Any, agent: Any, job: str) -> list[dict[str, Any]]:
    rows = tools.http("GET", agent.url + "/v1/ranks").json()["ranks"]
    return [row for row in rows if row["job"] == job]


def _events(tools: Any, agent: Any, job: str) -> dict[int, dict[str, Any]]:
    reply = tools.http("GET", agent.url + f"/v1/events?kind=rank_exit&job={job}")
    return {event["rank"]: event for event in reply.json()["events"]}


def test_rank_exit_code_and_kill_signal_reach_events_and_metrics(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    agent = start_agent()
    if not agent.agent.watcher.exits.available:
        pytest.skip(f"no proc connector: {agent.agent.watcher.exits.reason}")
    release = tmp_path / "release"
    launcher = fake_torchrun(
        [0, 1], env={"FAKE_RANK_EXIT_ON": str(release), "FAKE_RANK_EXIT_CODE": "3"}
    )
    doomed = launcher.wait_pid(1)
    launcher.wait_pid(0)
    # Only this job's ranks: other jobs may run on the machine (the watcher sees them too).
    tools.wait_for(lambda: len(_ranks(tools, agent, launcher.job)) == 2)
    os.kill(doomed, signal.SIGKILL)  # the launcher (torchrun's stand-in) reaps it
    tools.wait_for(lambda: 1 in _events(tools, agent, launcher.job))
    release.touch()  # rank 0 exits with code 3
    events = tools.wait_for(
        lambda: (found := _events(tools, agent, launcher.job)).keys() == {0, 1} and found
    )

    assert events[0]["exit_code"] == 3 and events[0]["exit_signal"] is None
    assert events[0]["reason"] == "exit_code"
    assert events[1]["exit_code"] == -9 and events[1]["exit_signal"] == "SIGKILL"
    assert events[1]["reason"] == "signal"
    scrape = tools.scrape(agent.url)
    job = launcher.job
    assert scrape.value("stormwatch_proc_connector_up") == 1
    health = tools.http("GET", agent.url + "/healthz").json()
    assert health["proc_connector"] == {"up": True, "reason": None}
    assert (
        scrape.value("stormwatch_rank_exits_total", training_job=job, rank="0", reason="exit_code")
        == 1
    )
    assert (
        scrape.value("stormwatch_rank_exits_total", training_job=job, rank="1", reason="signal")
        == 1
    )
    assert scrape.value("stormwatch_rank_last_exit_code", training_job=job, rank="0") == 3
    assert scrape.value("stormwatch_rank_last_exit_code", training_job=job, rank="1") == -9


def test_issue18_a_rank_asked_to_stop_is_a_stop_unless_a_kill_rank_fault_sent_the_sigterm(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    """A SIGTERM the rank takes for a stop request (its ``rank<R>.stopping`` marker, which
    the telemetry API writes): a cancel, a requeue, torchrun stopping the siblings of a
    failed rank or resizing. Its exit is ``stopped``, not unexpected, so no rule calls it
    a failure. The same SIGTERM from the agent's own ``kill_rank`` fault is a failure."""
    agent = start_agent()
    launcher = fake_torchrun([0, 1], env={"FAKE_RANK_STOP_MARKER": "1"})
    stopped = launcher.wait_pid(0)
    launcher.wait_pid(1)
    job = launcher.job
    tools.wait_for(lambda: len(_ranks(tools, agent, job)) == 2)
    tools.wait_for(  # written just before the fake rank installs its SIGTERM handler
        lambda: all(
            tools.scrape(agent.url).value("stormwatch_train_steps_total", training_job=job, rank=r)
            == 3
            for r in "01"
        )
    )
    time.sleep(0.5)
    os.kill(stopped, signal.SIGTERM)  # a scheduler's stop
    reply = tools.http(
        "POST",
        agent.fault_url + "/v1/faults",
        body={"id": "term", "kind": "kill_rank", "rank": 1, "job": job, "signal": "SIGTERM"},
        token=tools.token,
    )
    assert reply.status == 201, reply.text
    events = tools.wait_for(
        lambda: (found := _events(tools, agent, job)).keys() == {0, 1} and found
    )
    assert events[0]["reason"] == "stopped", events[0]
    assert events[1]["reason"] != "stopped", events[1]
    # the event log is written at the exit; /metrics may show the scan before it for a moment
    scrape = tools.wait_for(
        lambda: (
            (s := tools.scrape(agent.url)).value(
                "stormwatch_rank_exits_total", training_job=job, rank="0", reason="stopped"
            )
            is not None
            and s
        )
    )
    assert scrape.value("stormwatch_rank_unexpected_exits_total", training_job=job, rank="0") == 0
    assert scrape.value("stormwatch_rank_unexpected_exits_total", training_job=job, rank="1") == 1
    assert (
        scrape.value("stormwatch_rank_exits_total", training_job=job, rank="0", reason="stopped")
        == 1
    )


#: A rank still importing torch: no telemetry yet, SIGTERM's default action.
STARTING_RANK = "import time\ntime.sleep(120)\n"


def test_04_a_rank_stopped_before_its_telemetry_started_is_a_stop_in_a_job_using_the_api(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    """Game day 04's false RankCrashLoop: while node 1 could not reach the store, node 0's
    torchrun ended the group it had just started, three times, before the ranks' telemetry
    started, so they could write no stop marker. A SIGTERM exit without a marker is a stop
    in a job that uses the API here (a heartbeat of one of its ranks was read); the agent's
    own ``kill_rank`` SIGTERM stays a failure, and so does every SIGTERM exit of a job
    without the API (it never marks one)."""
    agent = start_agent()
    if not agent.agent.watcher.exits.available:
        pytest.skip(f"no proc connector: {agent.agent.watcher.exits.reason}")
    reporting = fake_torchrun([0], world_size=3, env={"FAKE_RANK_STOP_MARKER": "1"})
    job = reporting.job
    starting = fake_torchrun([1, 2], job=job, world_size=3, rank_code=STARTING_RANK)
    plain = fake_torchrun([0], rank_code=STARTING_RANK)  # a job without the API
    tools.wait_for(lambda: len(_ranks(tools, agent, job)) == 3 and _ranks(tools, agent, plain.job))
    tools.wait_for(
        lambda: (
            tools.scrape(agent.url).value(
                "stormwatch_train_steps_total", training_job=job, rank="0"
            )
            == 3
        )
    )
    time.sleep(1.5)  # a scan reads rank 0's heartbeat
    os.kill(starting.wait_pid(1), signal.SIGTERM)  # its torchrun's new rendezvous round
    os.kill(plain.wait_pid(0), signal.SIGTERM)
    reply = tools.http(
        "POST",
        agent.fault_url + "/v1/faults",
        body={"id": "term2", "kind": "kill_rank", "rank": 2, "job": job, "signal": "SIGTERM"},
        token=tools.token,
    )
    assert reply.status == 201, reply.text
    events = tools.wait_for(
        lambda: (found := _events(tools, agent, job)).keys() == {1, 2} and found
    )
    assert events[1]["reason"] == "stopped", events[1]
    assert events[2]["reason"] != "stopped", events[2]
    plain_exit = tools.wait_for(lambda: _events(tools, agent, plain.job).get(0))
    assert plain_exit["reason"] != "stopped", plain_exit
    scrape = tools.wait_for(
        lambda: (
            (s := tools.scrape(agent.url)).value(
                "stormwatch_rank_unexpected_exits_total", training_job=plain.job, rank="0"
            )
            == 1
            and s
        )
    )
    unexpected = "stormwatch_rank_unexpected_exits_total"
    assert scrape.value(unexpected, training_job=job, rank="1") == 0
    assert scrape.value(unexpected, training_job=job, rank="2") == 1


def test_a_watcher_without_exit_events_counts_the_exit_as_unknown(
    fake_torchrun: Any, metrics_dir: Path, tools: Any
) -> None:
    watcher = RankWatcher(metrics_dir, exits=UnavailableExits("test: no connector"))
    launcher = fake_torchrun([0])
    pid = launcher.wait_pid(0)
    tools.wait_for(lambda: watcher.scan() or watcher.ranks())
    os.kill(pid, signal.SIGKILL)
    tools.wait_for(lambda: not psutil.pid_exists(pid))  # reaped before any scan saw a zombie
    watcher.scan()
    assert watcher.exit_counts() == {(launcher.job, 0, "unknown"): 1}
    assert watcher.last_exit_codes() == {}


def test_an_agent_without_the_proc_connector_says_so_in_metrics_and_healthz(
    start_agent: Any, tools: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a kernel without CONFIG_PROC_EVENTS: the agent runs on, exit codes unknown.
    reason = "proc connector unavailable: Protocol not supported"
    monkeypatch.setattr(
        "stormwatch.agent.assembly.open_exit_source", lambda: UnavailableExits(reason)
    )
    agent = start_agent()
    assert tools.scrape(agent.url).value("stormwatch_proc_connector_up") == 0
    health = tools.http("GET", agent.url + "/healthz").json()
    assert health["proc_connector"] == {"up": False, "reason": reason}


REPARENTED_OPEN = textwrap.dedent(
    """
    import os, sys
    from stormwatch.agent.watch.proc_exits import open_exit_source
    source = open_exit_source()
    with open(sys.argv[1], "w") as out:
        out.write(f"{os.getppid()} {source.available} {source.reason}")
    """
)


@pytest.mark.root
def test_an_agent_in_a_lab_namespace_reparented_to_init_still_opens_the_connector(
    tmp_path: Path,
) -> None:
    """The lab's agents run in a node's network namespace, daemonised: their ancestors
    are gone (parent: PID 1, whose namespace may be unreadable). The connector is opened
    from the initial network namespace all the same (through kthreadd's)."""
    if shutil.which("ip") is None or shutil.which("setsid") is None:
        pytest.skip("needs ip (iproute2) and setsid")
    if not open_exit_source().available:
        pytest.skip("no proc connector on this machine at all")
    name = f"swpe{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        out = tmp_path / "opened"
        script = tmp_path / "open.py"
        script.write_text(REPARENTED_OPEN)
        subprocess.run(
            ["ip", "netns", "exec", name, "setsid", "-f", sys.executable, str(script), str(out)],
            check=True,
        )
        deadline = time.monotonic() + 30
        while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        ppid, available, reason = out.read_text().split(" ", 2)
        assert int(ppid) != os.getpid()  # re-parented: no ancestor of ours is left to join
        assert available == "True", reason
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_a_tracked_rank_s_exit_event_starts_a_scan_before_the_interval(
    fake_torchrun: Any, metrics_dir: Path, tools: Any
) -> None:
    source = open_exit_source()
    if not source.available:
        pytest.skip(f"no proc connector on this machine: {source.reason}")
    exits: list[Any] = []
    # An interval far longer than the test: only the exit event can start the second scan.
    watcher = RankWatcher(metrics_dir, exits=source, interval=600.0, on_exit=exits.append)
    launcher = fake_torchrun([0])
    try:
        pid = launcher.wait_pid(0)
        tools.wait_for(lambda: watcher.scan() or watcher.ranks())
        watcher.start()  # scans once now, then waits for the interval or an exit event
        os.kill(pid, signal.SIGKILL)
        tools.wait_for(lambda: exits, timeout=30)  # 600 s without the event
    finally:
        watcher.stop()
        source.close()
    assert [(e.rank, e.exit_code) for e in exits] == [(0, -9)]


def _watched_rank(
    fake_torchrun: Any, metrics_dir: Path, tools: Any
) -> tuple[RankWatcher, list[str], int, str]:
    """A watcher (scanned only when the test says) that already tracks rank 0 of a new
    job, recording the order of its listener's and ``on_exit``'s calls: (watcher, the
    calls, rank 0's pid, the job)."""
    order: list[str] = []
    watcher = RankWatcher(metrics_dir, interval=600.0, on_exit=lambda e: order.append("exit"))
    watcher.add_listener(lambda: order.append("listener"))
    launcher = fake_torchrun([0])
    pid = launcher.wait_pid(0)
    tools.wait_for(lambda: watcher.scan() or watcher.ranks())
    order.clear()
    return watcher, order, pid, launcher.job


def test_cc14_an_exit_is_published_only_after_the_exposition_was_told_to_render_it(
    fake_torchrun: Any, metrics_dir: Path, tools: Any
) -> None:
    """CI cc14: the exit event (``/v1/events``) was recorded inside the scan, the
    exposition's invalidation only at its end, so a scrape between them served the cached
    body without the exit. The listeners (the exposition's ``changed``) now come first."""
    watcher, order, pid, _ = _watched_rank(fake_torchrun, metrics_dir, tools)
    os.kill(pid, signal.SIGKILL)
    tools.wait_for(lambda: watcher.scan() or "exit" in order)
    assert order == ["listener", "exit"]


def test_an_exit_counted_by_a_scan_that_then_fails_is_still_published(
    fake_torchrun: Any, metrics_dir: Path, tools: Any
) -> None:
    """The exit is counted and the rank no longer tracked as alive, so the next scan would
    not see it again: a scan failing after that (a gauge file gone under ``mark_dead``)
    must still call the listeners and ``on_exit``."""
    watcher, order, pid, job = _watched_rank(fake_torchrun, metrics_dir, tools)

    def vanished(table: Any) -> None:
        raise FileNotFoundError("a live-gauge file removed under the scan")

    watcher._files.mark_dead = vanished
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while "exit" not in order:  # every scan fails; the one that sees the exit publishes it
        assert time.monotonic() < deadline, "the exit was never published"
        with pytest.raises(FileNotFoundError):
            watcher.scan()
        time.sleep(0.05)
    assert order == ["listener", "exit"]
    assert watcher.unexpected_exits()[(job, 0)] == 1


def test_an_exit_listener_that_raises_does_not_stop_exits_being_received() -> None:
    source = open_exit_source()
    if not source.available:
        pytest.skip(f"no proc connector on this machine: {source.reason}")

    def broken(pid: int) -> None:
        raise RuntimeError("listener bug")

    source.on_exit(broken)
    try:
        started = time.time()
        first = subprocess.run([sys.executable, "-c", "raise SystemExit(4)"], check=False)
        second = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])
        second.wait(30)
        found = source.lookup(second.pid, since=started, wait=5)
    finally:
        source.close()
    assert first.returncode == 4
    assert source.available and found is not None and found.returncode == 5
