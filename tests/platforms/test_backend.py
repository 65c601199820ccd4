"""The lab backend against real processes that carry a rank's environment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import pytest

from stormwatch.platforms import BackendError, LabBackend


@pytest.fixture
def nodes(tmp_path: Path) -> dict[str, Path]:
    dirs = {name: tmp_path / name / "metrics" for name in ("node0", "node1")}
    for path in dirs.values():
        path.mkdir(parents=True)
    return dirs


def _gone(pid: int) -> bool:
    """Exited (a zombie its stand-in parent has not reaped yet has exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _backend(tmp_path: Path, nodes: dict[str, Path]) -> LabBackend:
    return LabBackend(
        diagnostics_dir=tmp_path / "diag",
        node_metrics_dirs=nodes,
        clock=lambda: 1234.5,
        grace_period_s=1,  # the stand-ins ignore SIGTERM: SIGKILL after 1 s
    )


def test_workers_are_found_by_job_with_their_node(
    tmp_path: Path, nodes: dict[str, Path], fake_job: Any, kit: Any
) -> None:
    fake_job("train", nodes["node0"], workers=2, first_rank=0)
    fake_job("train", nodes["node1"], workers=2, first_rank=2)
    fake_job("other", nodes["node0"], workers=1)
    backend = _backend(tmp_path, nodes)
    workers = kit.wait_for(
        lambda: len(backend.workers("train")) == 4 and backend.workers("train"), 20, "workers"
    )
    assert [(w.rank, w.node) for w in workers] == [
        (0, "node0"),
        (1, "node0"),
        (2, "node1"),
        (3, "node1"),
    ]


def test_restart_workers_signals_every_worker_of_the_job_only(
    tmp_path: Path, nodes: dict[str, Path], fake_job: Any, kit: Any
) -> None:
    train = fake_job("train", nodes["node0"], workers=2)
    other = fake_job("other", nodes["node1"], workers=1)
    backend = _backend(tmp_path, nodes)
    kit.wait_for(lambda: len(backend.workers("train")) == 2, 20, "workers")
    detail = backend.restart_workers("train")
    assert "SIGTERM to 2 workers of job train" in detail
    assert train.terms("worker") == 2  # handled, and ignored: SIGKILL after the grace period
    assert "SIGKILL to 2 still running 1 s after SIGTERM" in detail
    assert all(_gone(pid) for pid in train.worker_pids)  # gone when the action answers
    assert other.terms("worker") == 0 and train.terms("agent") == 0
    assert not _gone(train.agent.pid) and len(backend.workers("other")) == 1


def test_exclude_node_signals_the_torchrun_agent_on_that_node(
    tmp_path: Path, nodes: dict[str, Path], fake_job: Any, kit: Any
) -> None:
    on0 = fake_job("train", nodes["node0"], workers=1, first_rank=0)
    on1 = fake_job("train", nodes["node1"], workers=1, first_rank=1)
    backend = _backend(tmp_path, nodes)
    kit.wait_for(lambda: len(backend.workers("train")) == 2, 20, "workers")
    detail = backend.exclude_node_and_restart("train", "node1")
    assert f"the torchrun agents [{on1.agent.pid}] of job train on node1" in detail
    assert on1.terms("agent") == 1 and on1.terms("worker") == 0  # SIGTERM to torchrun only
    # it ignored it: it and its worker are SIGKILLed after the grace period, gone on return
    assert (
        f"SIGKILL to 2 still running 1 s after SIGTERM (pids {sorted([on1.agent.pid, *on1.worker_pids])})"
        in detail
    )
    assert _gone(on1.agent.pid) and _gone(on1.worker_pids[0])
    assert on0.terms("agent") == 0 and not _gone(on0.agent.pid)
    with pytest.raises(BackendError, match="no live worker on node 'node9'"):
        backend.exclude_node_and_restart("train", "node9")


def test_checkpoint_now_keeps_armed_chaos_faults_in_the_control_file(
    tmp_path: Path, nodes: dict[str, Path], fake_job: Any, kit: Any
) -> None:
    fake_job("train", nodes["node0"], workers=2)
    backend = _backend(tmp_path, nodes)
    kit.wait_for(lambda: len(backend.workers("train")) == 2, 20, "workers")
    control = nodes["node0"] / "control" / "rank0.json"
    control.parent.mkdir()
    armed = {"point": "slow_step", "seconds": 0.5}
    control.write_text(
        json.dumps({"faults": [armed, {"point": "checkpoint_now", "requested_at": 1}]})
    )
    assert str(control) in backend.request_checkpoint("train")
    assert json.loads(control.read_text()) == {
        "faults": [armed, {"point": "checkpoint_now", "requested_at": 1234.5}]
    }


def test_collect_diagnostics_writes_each_workers_state(
    tmp_path: Path, nodes: dict[str, Path], fake_job: Any, kit: Any
) -> None:
    fake_job("train", nodes["node0"], workers=2)
    backend = _backend(tmp_path, nodes)
    kit.wait_for(lambda: len(backend.workers("train")) == 2, 20, "workers")
    backend.collect_diagnostics("train", 7)
    report = json.loads((tmp_path / "diag" / "incident-7.json").read_text())
    assert [w["rank"] for w in report["workers"]] == [0, 1]
    assert all("status" in w and "stack" in w for w in report["workers"])


def test_actions_on_a_job_without_workers_raise(tmp_path: Path, nodes: dict[str, Path]) -> None:
    backend = _backend(tmp_path, nodes)
    for call in (backend.restart_workers, backend.request_checkpoint):
        with pytest.raises(BackendError, match="no live worker of job 'ghost'"):
            call("ghost")


def test_exclude_node_also_stops_workers_that_outlived_their_torchrun(
    tmp_path: Path, nodes: dict[str, Path], fake_job: Any, kit: Any
) -> None:
    """Issue 21: the node's torchrun died hard; its worker, adopted by init, is found by its
    environment and stopped itself (SIGTERM, SIGKILL after the grace period), confirmed gone."""
    on1 = fake_job("train", nodes["node1"], workers=1, first_rank=1)
    backend = _backend(tmp_path, nodes)
    kit.wait_for(lambda: len(backend.workers("train")) == 1, 20, "workers")
    on1.agent.kill()
    on1.agent.wait(10)
    [orphan] = on1.worker_pids
    kit.wait_for(lambda: psutil.Process(orphan).ppid() != on1.agent.pid, 10, "re-parented")
    if psutil.Process(orphan).ppid() != 1:
        pytest.skip("a subreaper adopts orphans here, not init")
    detail = backend.exclude_node_and_restart("train", "node1")
    assert f"and to the workers [{orphan}] that outlived theirs" in detail, detail
    assert on1.terms("worker") == 1  # SIGTERM to the worker itself, then SIGKILL
    assert _gone(orphan)


def _rank_process(job: str, metrics_dir: str, cwd: Path) -> Any:
    """A sleeping process with rank 0's environment of ``job``, run in ``cwd``."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "TORCHELASTIC_RUN_ID": f"run-{job}",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "STORMWATCH_JOB": job,
        "STORMWATCH_METRICS_DIR": metrics_dir,
    }
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, cwd=cwd)


def test_a_relative_metrics_dir_is_the_workers_own_and_a_symlink_loop_is_no_node(
    tmp_path: Path, nodes: dict[str, Path], kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``STORMWATCH_METRICS_DIR=node0/metrics`` names the worker's node0 relative to its own
    working directory: run from this lab's folder it is this lab's node0; run from another
    lab's folder it is not, whatever the directory this process runs in. A path that loops
    is no node (and no traceback)."""
    other_lab = tmp_path / "other-lab"
    (other_lab / "node0" / "metrics").mkdir(parents=True)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    monkeypatch.chdir(tmp_path)  # where this lab's node0/metrics is, relative
    processes = [
        _rank_process("mine", "node0/metrics", cwd=tmp_path),
        _rank_process("theirs", "node0/metrics", cwd=other_lab),
        _rank_process("looped", str(loop / "metrics"), cwd=tmp_path),
    ]
    try:
        backend = _backend(tmp_path, nodes)
        mine = kit.wait_for(lambda: backend.workers("mine"), 20, "the relative worker")
        assert [(w.rank, w.node) for w in mine] == [(0, "node0")]
        assert backend.workers("theirs") == []
        assert backend.workers("looped") == []
        with pytest.raises(BackendError, match="no live worker of job 'theirs'"):
            backend.restart_workers("theirs")
        assert all(p.poll() is None for p in processes)  # nobody was signalled
    finally:
        for process in processes:
            process.kill()
            process.wait()
