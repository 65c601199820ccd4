"""The agent's fault catalogue on real processes, files, mounts and the simulated GPUs.

Each test injects through the fault API, observes the effect where production
would see it (process state, the agent's own metrics, the trainer's control
file, a write that fails), reverts (by request or at the TTL) and checks the
effect is gone. Network faults need namespaces: tests/chaos/test_fault_network.py.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from stormwatch.agent import FakeNvml
from stormwatch.faults.control_file import ControlFile

BUSY_RANK = "import os, signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\nwhile True:\n    pass\n"


def _post(tools: Any, agent: Any, body: dict[str, Any]) -> dict[str, Any]:
    reply = tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
    assert reply.status in (200, 201), reply.text
    return dict(reply.json())


def _delete(tools: Any, agent: Any, fault_id: str) -> dict[str, Any]:
    reply = tools.http("DELETE", agent.fault_url + f"/v1/faults/{fault_id}", token=tools.token)
    assert reply.status == 200, reply.text
    record = dict(reply.json())
    assert record["state"] == "reverted", record
    return record


def _record(tools: Any, agent: Any, fault_id: str) -> dict[str, Any]:
    return dict(
        tools.http("GET", agent.fault_url + f"/v1/faults/{fault_id}", token=tools.token).json()
    )


def _post_when_ranks_seen(tools: Any, agent: Any, body: dict[str, Any], count: int = 1) -> Any:
    """POST once the agent's rank watcher lists ``count`` live ranks of ``body['job']``."""

    def seen() -> bool:
        ranks = tools.http("GET", agent.url + "/v1/ranks").json()["ranks"]
        return len([r for r in ranks if r["job"] == body["job"] and r["alive"]]) >= count

    tools.wait_for(seen)
    return tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)


def _status(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"


# ---------------------------------------------------------------------- GPU
def test_xid_48_shows_in_the_agent_metrics_with_a_double_bit_error(
    start_agent: Any, tools: Any
) -> None:
    agent = start_agent(fake=FakeNvml(2))
    _post(tools, agent, {"id": "xid-48", "kind": "gpu_xid", "gpu": 1, "xid": 48, "ttl_seconds": 30})

    def last_xid() -> float | None:
        agent.sample()
        return tools.scrape(agent.url).value("DCGM_FI_DEV_XID_ERRORS", gpu="1")

    assert tools.wait_for(lambda: last_xid() == 48)
    assert agent.fake.gpus[1].counters["ecc_dbe_vol"] == 1
    assert _delete(tools, agent, "xid-48")["revert_reason"] == "request"


def test_xid_79_loses_the_gpu_until_reverted(start_agent: Any, tools: Any) -> None:
    agent = start_agent(fake=FakeNvml(2))
    record = _post(
        tools, agent, {"id": "xid-79", "kind": "gpu_xid", "gpu": 0, "xid": 79, "ttl_seconds": 30}
    )
    assert record["details"]["lost"] is True

    def xid_79_counted() -> bool:
        agent.sample()
        return (
            tools.scrape(agent.url).value("stormwatch_gpu_xid_errors_total", gpu="0", code="79")
            == 1
        )

    tools.wait_for(xid_79_counted)  # what GpuXidFatal alerts on; then the GPU is gone

    def gpu0_up() -> float | None:
        agent.sample()
        return tools.scrape(agent.url).value("stormwatch_gpu_up", gpu="0")

    tools.wait_for(lambda: gpu0_up() == 0)
    scrape = tools.scrape(agent.url)
    assert scrape.value("stormwatch_gpu_up", gpu="1") == 1
    _delete(tools, agent, "xid-79")
    agent.sample()
    assert tools.scrape(agent.url).value("stormwatch_gpu_up", gpu="0") == 1


@pytest.mark.parametrize(
    ("reason", "active"),
    [("thermal", "hw_thermal_slowdown"), ("power", "hw_power_brake_slowdown")],
)
def test_gpu_throttle_sets_the_reason_bits_and_revert_clears_them(
    start_agent: Any, tools: Any, reason: str, active: str
) -> None:
    agent = start_agent(fake=FakeNvml(1))
    _post(
        tools,
        agent,
        {"id": f"thr-{reason}", "kind": "gpu_throttle", "reason": reason, "ttl_seconds": 30},
    )
    agent.sample()
    assert (
        tools.scrape(agent.url).value("stormwatch_gpu_clocks_event_active", gpu="0", reason=active)
        == 1
    )
    _delete(tools, agent, f"thr-{reason}")
    agent.sample()
    assert (
        tools.scrape(agent.url).value("stormwatch_gpu_clocks_event_active", gpu="0", reason=active)
        == 0
    )


def test_nvlink_down_and_error_burst_show_per_link(start_agent: Any, tools: Any) -> None:
    agent = start_agent(fake=FakeNvml(1, links_per_gpu=4))
    _post(tools, agent, {"id": "nvl-down", "kind": "nvlink_down", "links": [2], "ttl_seconds": 30})
    _post(
        tools,
        agent,
        {"id": "nvl-err", "kind": "nvlink_errors", "link": 1, "counter": "replay", "count": 500},
    )
    agent.sample()
    scrape = tools.scrape(agent.url)
    assert scrape.value("stormwatch_nvlink_link_up", gpu="0", link="2") == 0
    assert scrape.value("stormwatch_nvlink_link_up", gpu="0", link="1") == 1
    assert (
        scrape.value("stormwatch_nvlink_errors_total", gpu="0", link="1", counter="replay") == 500
    )
    _delete(tools, agent, "nvl-down")
    _delete(tools, agent, "nvl-err")
    agent.sample()
    scrape = tools.scrape(agent.url)
    assert scrape.value("stormwatch_nvlink_link_up", gpu="0", link="2") == 1
    assert (
        scrape.value("stormwatch_nvlink_errors_total", gpu="0", link="1", counter="replay") == 500
    )


def test_gpu_lost_ends_at_its_ttl(start_agent: Any, tools: Any) -> None:
    agent = start_agent(fake=FakeNvml(1))
    _post(tools, agent, {"id": "lost", "kind": "gpu_lost", "ttl_seconds": 0.5})
    assert agent.fake.gpus[0].lost
    tools.wait_for(lambda: _record(tools, agent, "lost")["state"] == "reverted")
    assert not agent.fake.gpus[0].lost
    assert _record(tools, agent, "lost")["revert_reason"] == "ttl"


def test_power_cap_through_nvml_restores_the_previous_limit(start_agent: Any, tools: Any) -> None:
    fake = FakeNvml(1)
    agent = start_agent(fake=fake)
    body = {
        "id": "cap",
        "kind": "gpu_power_cap",
        "watts": 300.0,
        "max_clock_mhz": 1200,
        "ttl_seconds": 30,
    }
    record = _post(tools, agent, body)
    assert record["details"]["previous_power_limit_mw"] == 700_000
    assert fake.gpus[0].power_limit_mw == 300_000
    assert fake.gpus[0].locked_clocks_mhz == (210, 1200)
    _delete(tools, agent, "cap")
    assert fake.gpus[0].power_limit_mw == 700_000 and fake.gpus[0].locked_clocks_mhz is None


def test_power_cap_out_of_range_is_refused_and_leaves_nothing_applied(
    start_agent: Any, tools: Any
) -> None:
    fake = FakeNvml(1)
    agent = start_agent(fake=fake)
    body = {"id": "cap-bad", "kind": "gpu_power_cap", "watts": 50.0, "ttl_seconds": 30}
    reply = tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
    assert reply.status == 400 and reply.json()["fields"][0]["field"] == "watts", reply.text
    assert "200 to 700 W" in reply.json()["error"]
    assert fake.gpus[0].power_limit_mw == 700_000


# ------------------------------------------------------------ trainer points
def test_trainer_fault_arms_the_control_file_and_revert_leaves_other_entries(
    start_agent: Any, fake_torchrun: Any, tools: Any, metrics_dir: Path
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0, 1], rank_args=["train", "--metrics-dir", str(metrics_dir)])
    launcher.wait_pid(1)
    control = metrics_dir / "control" / "rank1.json"
    control.parent.mkdir()
    control.write_text(json.dumps({"faults": [{"point": "checkpoint_now", "requested_at": 1.0}]}))
    body = {
        "id": "slow-1",
        "kind": "trainer_fault",
        "rank": 1,
        "job": launcher.job,
        "point": "collective_delay",
        "seconds": 0.2,
        "op": "all_reduce",
        "ttl_seconds": 30,
    }
    assert _post_when_ranks_seen(tools, agent, body, 2).status == 201
    armed = ControlFile.model_validate_json(control.read_text())  # what the trainer accepts
    points = {f.point: f for f in armed.faults}
    assert points["collective_delay"].expires_at == pytest.approx(time.time() + 30, abs=5)
    assert "checkpoint_now" in points
    _delete(tools, agent, "slow-1")
    assert [f.point for f in ControlFile.model_validate_json(control.read_text()).faults] == [
        "checkpoint_now"
    ]


# -------------------------------------------------------------- processes
def test_freeze_of_a_whole_node_stops_every_rank_and_the_agent_continues_them_at_ttl(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0, 1])
    pids = [launcher.wait_pid(0), launcher.wait_pid(1)]
    body = {"id": "freeze-node", "kind": "freeze_ranks", "job": launcher.job, "ttl_seconds": 1.0}
    assert _post_when_ranks_seen(tools, agent, body, 2).status == 201
    assert [_status(p) for p in pids] == [psutil.STATUS_STOPPED] * 2
    assert _status(launcher.proc.pid) != psutil.STATUS_STOPPED  # include_torchrun: false
    tools.wait_for(lambda: _record(tools, agent, "freeze-node")["state"] == "reverted")
    assert all(_status(p) in (psutil.STATUS_SLEEPING, psutil.STATUS_RUNNING) for p in pids)


def test_kill_torchrun_kills_the_launcher_and_kill_node_processes_everything(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    first = fake_torchrun([0])
    orphan = first.wait_pid(0)
    body = {"id": "kill-tr", "kind": "kill_torchrun", "job": first.job, "ttl_seconds": 5}
    assert _post_when_ranks_seen(tools, agent, body).status == 201
    assert first.proc.wait(10) == -9
    assert _status(orphan) not in ("gone", psutil.STATUS_ZOMBIE)  # its rank runs on
    _delete(tools, agent, "kill-tr")  # the revert stops the rank the kill orphaned
    assert _status(orphan) in ("gone", psutil.STATUS_ZOMBIE)
    second = fake_torchrun([2, 3])
    ranks = [second.wait_pid(2), second.wait_pid(3)]
    body = {"id": "kill-node", "kind": "kill_node_processes", "job": second.job, "ttl_seconds": 5}
    assert _post_when_ranks_seen(tools, agent, body, 2).status == 201
    assert second.proc.wait(10) == -9
    tools.wait_for(lambda: all(_status(p) in ("gone", psutil.STATUS_ZOMBIE) for p in ranks))


def test_kill_rdzv_host_is_refused_by_a_node_that_does_not_host_the_store(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0])
    launcher.wait_pid(0)
    body = {"id": "kill-host", "kind": "kill_rdzv_host", "job": launcher.job}
    reply = _post_when_ranks_seen(tools, agent, body)
    assert reply.status == 404 and "does not host" in reply.json()["error"], reply.text
    assert launcher.proc.poll() is None


# -------------------------------------------------------------- slowdown
def _cpu_rate(pid: int, seconds: float = 1.0) -> float:
    process = psutil.Process(pid)
    before = sum(process.cpu_times()[:2])
    time.sleep(seconds)
    return (sum(process.cpu_times()[:2]) - before) / seconds


def _stopped_fraction(pid: int, seconds: float = 1.0) -> float:
    """Share of state samples (every 5 ms for ``seconds``) that find ``pid`` stopped."""
    samples = stopped = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples += 1
        stopped += _status(pid) == psutil.STATUS_STOPPED
        time.sleep(0.005)
    return stopped / samples


def test_cpu_throttle_cgroup_quota_holds_the_rank_and_revert_moves_it_back(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0], rank_code=BUSY_RANK)
    pid = launcher.wait_pid(0)
    body = {
        "id": "cpu-cg",
        "kind": "cpu_throttle",
        "rank": 0,
        "job": launcher.job,
        "cpu_fraction": 0.2,
        "method": "cgroup",
    }
    reply = _post_when_ranks_seen(tools, agent, body)
    if reply.status == 500 and "no cgroup CPU controller" in reply.text:
        pytest.skip("no cgroup CPU controller on this machine")
    details = reply.json()["details"]
    cgroup = Path(details["cgroup"])
    assert str(pid) in (cgroup / "cgroup.procs").read_text().split()
    quota = (
        (cgroup / "cpu.max").read_text()
        if details["method"] == "cgroup-v2"
        else (cgroup / "cpu.cfs_quota_us").read_text()
    )
    assert quota.split()[0] == "20000"
    assert _cpu_rate(pid) < 0.4  # the quota: 0.2 CPU
    _delete(tools, agent, "cpu-cg")
    assert not cgroup.exists()


def test_cpu_throttle_duty_cycle_slows_the_rank_and_revert_leaves_it_running(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0], rank_code=BUSY_RANK)
    pid = launcher.wait_pid(0)
    body = {
        "id": "cpu-dc",
        "kind": "cpu_throttle",
        "rank": 0,
        "job": launcher.job,
        "cpu_fraction": 0.2,
        "method": "duty_cycle",
    }
    assert _post_when_ranks_seen(tools, agent, body).status == 201
    stopped = _stopped_fraction(pid)
    _delete(tools, agent, "cpu-dc")
    # SIGSTOP holds the rank 80 ms of every 100 ms. The share of samples that find it
    # stopped does not depend on how busy the box is, unlike its CPU rate (a busy loop
    # got 0.18 of a core under `make test` in CI, so "slower than free" measured noise).
    assert stopped > 0.5, stopped
    time.sleep(0.3)
    assert _status(pid) != psutil.STATUS_STOPPED
    assert _cpu_rate(pid, 0.5) > 0.0  # it runs again


# ---------------------------------------------------------------- storage
def _write_fails(folder: Path) -> int | None:
    try:
        (folder / f"new-{time.monotonic_ns()}").write_bytes(b"x" * 100_000)
    except OSError as exc:
        return exc.errno
    return None


@pytest.mark.root
@pytest.mark.parametrize(
    ("kind", "code"), [("checkpoint_readonly", errno.EROFS), ("checkpoint_full", errno.ENOSPC)]
)
def test_checkpoint_folder_fault_fails_writes_then_revert_restores_everything(
    start_agent: Any, tools: Any, tmp_path: Path, kind: str, code: int
) -> None:
    folder = tmp_path / "checkpoints"
    (folder / "step-00000010").mkdir(parents=True)
    (folder / "step-00000010" / "shard.bin").write_bytes(b"weights")
    agent = start_agent()
    _post(tools, agent, {"id": kind, "kind": kind, "path": str(folder), "ttl_seconds": 30})
    assert _write_fails(folder) == code
    assert (folder / "step-00000010" / "shard.bin").read_bytes() == b"weights"  # still readable
    with pytest.raises(OSError):
        (folder / "step-00000010" / "shard.bin").unlink()  # nothing can be deleted either
    _delete(tools, agent, kind)
    assert _write_fails(folder) is None
    assert (folder / "step-00000010" / "shard.bin").read_bytes() == b"weights"
    mounts = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True
    ).stdout
    assert str(folder) not in mounts.split()
    assert os.listdir(folder / "step-00000010") == ["shard.bin"]


RDZV_LAUNCHER = """
import os, socket, subprocess, sys, time
args = sys.argv[1:]
port = int(args[args.index("--rdzv-endpoint") + 1].rsplit(":", 1)[1])
job, metrics = args[-2], args[-1]
store = socket.create_server(("127.0.0.1", port))  # the c10d store this torchrun hosts
env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TORCHELASTIC_RUN_ID=job,
           STORMWATCH_JOB=job, STORMWATCH_METRICS_DIR=metrics)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_kill_rdzv_host_kills_the_torchrun_listening_on_the_rendezvous_port(
    start_agent: Any, tools: Any, tmp_path: Path, metrics_dir: Path
) -> None:
    agent = start_agent()
    script = tmp_path / "host" / "torchrun"
    script.parent.mkdir()
    script.write_text(RDZV_LAUNCHER)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    job = f"rdzv-{port}"
    argv = [
        sys.executable,
        str(script),
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-conf",
        "is_host=1",
    ]
    host = subprocess.Popen([*argv, job, str(metrics_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        rank_pid = int(host.stdout.readline())
        reply = _post_when_ranks_seen(
            tools, agent, {"id": "kill-host", "kind": "kill_rdzv_host", "job": job}
        )
        assert reply.status == 201, reply.text
        assert reply.json()["target_pid"] == host.pid
        assert host.wait(10) == -9
    finally:
        host.kill()
        host.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank_pid, 9)
        if host.stdout is not None:
            host.stdout.close()


@pytest.mark.root
def test_checkpoint_fault_defaults_to_the_jobs_checkpoint_dir(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "job-checkpoints"
    folder.mkdir()
    agent = start_agent()
    launcher = fake_torchrun([0], rank_args=["train", "--checkpoint-dir", str(folder)])
    body = {
        "id": "ro-default",
        "kind": "checkpoint_readonly",
        "job": launcher.job,
        "ttl_seconds": 30,
    }
    reply = _post_when_ranks_seen(tools, agent, body)
    assert reply.status == 201, reply.text
    assert reply.json()["details"]["path"] == str(folder)
    assert _write_fails(folder) == errno.EROFS
    _delete(tools, agent, "ro-default")
    assert _write_fails(folder) is None


#: A rank in a mount namespace of its own, as in a container or under ``ip netns exec`` (which
#: unshares one for every command it runs): host mounts propagate in, its own do not leak out.
PRIVATE_MOUNT_NS_RANK = """
import ctypes, subprocess, time
assert ctypes.CDLL(None, use_errno=True).unshare(0x00020000) == 0  # CLONE_NEWNS
subprocess.run(["mount", "--make-rslave", "/"], check=True)
print("unshared", flush=True)
time.sleep(600)
"""


@pytest.mark.root
@pytest.mark.parametrize(
    ("kind", "code"), [("checkpoint_readonly", errno.EROFS), ("checkpoint_full", errno.ENOSPC)]
)
def test_a_checkpoint_fault_lands_in_the_mount_namespace_the_ranks_write_from(
    start_agent: Any, fake_torchrun: Any, tools: Any, tmp_path: Path, kind: str, code: int
) -> None:
    """The game-day bug: the agent mounted in its own namespace, so the trainer (another
    one) saved its checkpoint as if nothing had happened."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    agent = start_agent()
    launcher = fake_torchrun(
        [0],
        rank_args=["train", "--checkpoint-dir", str(folder)],
        rank_code=PRIVATE_MOUNT_NS_RANK,
        write_metrics=False,
    )
    pid = launcher.wait_pid(0)
    seen_by_rank = Path(f"/proc/{pid}/root") / folder.relative_to("/")
    deadline = time.monotonic() + 10
    while os.stat(f"/proc/{pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino:
        assert time.monotonic() < deadline, "the rank did not unshare its mount namespace"
        time.sleep(0.05)
    body = {"id": f"ns-{kind}", "kind": kind, "job": launcher.job, "ttl_seconds": 30}

    reply = _post_when_ranks_seen(tools, agent, body)

    assert reply.status == 201, reply.text
    [mounts] = reply.json()["details"]["mounts"]
    assert mounts["ns_ino"] == os.stat(f"/proc/{pid}/ns/mnt").st_ino
    assert _write_fails(seen_by_rank) == code  # what the trainer sees
    assert _write_fails(folder) is None  # this namespace is untouched
    _delete(tools, agent, f"ns-{kind}")
    assert _write_fails(seen_by_rank) is None
    assert str(folder) not in Path(f"/proc/{pid}/mountinfo").read_text()
