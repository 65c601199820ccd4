"""kill_rank end to end without a lab: a real agent kills a real torchrun worker, torchrun restarts it.

The workers are ``workload.py`` stand-in ranks under a real ``torchrun`` (so the
agent's rank watcher finds them exactly as in the lab); the controller is the
library's runner. Needs no root and no network namespaces.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stormwatch.chaos import (
    AttachedJobs,
    Ledger,
    Runner,
    RunnerConfig,
    Target,
    ledger_path,
    parse_experiment,
)
from stormwatch.chaos.reports.report import generate_postmortem
from stormwatch.platforms import AgentEndpoint
from stormwatch.telemetry.ranklogs import read_job_logs

WORKLOAD = Path(__file__).resolve().parent / "workload.py"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def torchrun_job(
    request: pytest.FixtureRequest, tmp_path: Path, unique_job: Any, wait_until: Any
) -> Iterator[tuple[str, Path]]:
    """Two stand-in ranks under torchrun (max 3 restarts, or ``request.param`` when
    parametrized indirectly); yields (job name, run dir)."""
    max_restarts = getattr(request, "param", 3)
    job = unique_job("killrank").replace("-", "")[:30]
    run_dir = tmp_path / "run"
    log_dir = run_dir / "jobs" / job / "logs"
    env = {**os.environ, "STORMWATCH_JOB": job}
    proc = subprocess.Popen(
        [
            str(BIN / "torchrun"),
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            str(max_restarts),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{_free_port()}",
            "--rdzv-id",
            job,
            "--monitor-interval",
            "0.5",
            "--no-python",
            sys.executable,
            str(WORKLOAD),
            str(log_dir),
            "0.1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: len(read_job_logs(log_dir)) == 2, 120, "both ranks to start")
        yield job, run_dir
    finally:
        _stop(proc)


@pytest.fixture
def agent(tmp_path: Path, wait_until: Any) -> Iterator[tuple[AgentEndpoint, Path]]:
    """A real ``stormwatch agent`` on loopback, fault API on its own port; yields
    (its endpoint, token file)."""
    token = tmp_path / "agent.token"
    token.write_text("test-token\n")
    token.chmod(0o600)
    port, fault_port = _free_port(), _free_port()
    (tmp_path / "metrics").mkdir()
    proc = subprocess.Popen(
        [
            str(BIN / "stormwatch"),
            "agent",
            "run",
            "--listen",
            f"127.0.0.1:{port}",
            "--node",
            "n0",
            "--metrics-dir",
            str(tmp_path / "metrics"),
            "--gpu-backend",
            "sim",
            "--token-file",
            str(token),
            "--fault-api-listen",
            f"127.0.0.1:{fault_port}",
            "--state-dir",
            str(tmp_path / "agent-state"),
            "--sample-interval",
            "0.5",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(healthy, 60, "the agent to listen")
        yield AgentEndpoint(node="n0", url=url, fault_url=f"http://127.0.0.1:{fault_port}"), token
    finally:
        _stop(proc)


def test_kill_rank_through_the_agent_is_ledgered_recovered_and_reverted(
    agent: tuple[AgentEndpoint, Path],  # first: its start-up must not eat the job's steps
    torchrun_job: tuple[str, Path],
) -> None:
    job, run_dir = torchrun_job
    endpoint, token = agent
    experiment = parse_experiment(f"""
version: 1
title: kill rank 1 through the agent
job: {{name: {job}, steps: 1000000, checkpoint_every: 10, startup_timeout_seconds: 60}}
steady_state_hypothesis:
  title: both ranks step
  probes:
    - name: ranks-progressing
      provider: {{type: job, expect: progressing, window_seconds: 5}}
      timeout_seconds: 20
method:
  - type: action
    name: kill-rank-1
    when: {{step: 60}}
    fault: {{kind: kill_rank, rank: 1, signal: SIGKILL, ttl_seconds: 60}}
  - type: probe
    name: ranks-progressing-again
    provider: {{type: job, expect: progressing, window_seconds: 5}}
    timeout_seconds: 90
rollbacks:
  - {{type: revert, name: revert-experiment-faults}}
""")
    target = Target(
        run_dir=run_dir,
        jobs=AttachedJobs(run_dir, world_size=2),
        world_size=2,
        agents=(endpoint,),
        agent_token_file=token,
    )
    runner = Runner(
        experiment, source=Path("inline.yaml"), target=target, config=RunnerConfig(attach_job=job)
    )

    result = asyncio.run(runner.run())

    journal = result.journal
    assert result.exit_code == 0, journal.model_dump_json(indent=2)
    assert journal.status == "completed" and journal.hypothesis_held
    action = journal.method[0]
    assert action.status == "succeeded" and isinstance(action.output, dict)
    assert action.output["node"] == "n0" and action.output["target_pid"]
    assert isinstance(action.output["step"], int) and action.output["step"] >= 60
    [entry] = Ledger(ledger_path(run_dir), create=False).entries()
    assert entry.state == "reverted" and entry.revert_reason == "rollback revert-experiment-faults"
    assert entry.target.node == "n0" and entry.injected_at is not None
    logs = read_job_logs(run_dir / "jobs" / job / "logs")
    restarted = [e for e in logs[1].starts if e.attempt >= 1]
    assert restarted, "torchrun restarted the killed worker"

    pm, md = asyncio.run(
        generate_postmortem(runner.experiment_dir, target=target, baseline_log_dir=None)
    )
    assert pm.recovered and pm.time_to_recover_seconds is not None
    assert pm.workers_restarted_at is not None and pm.workers_restarted_at > entry.injected_at
    assert pm.steps_lost == pm.last_step_before_fault, "the stand-in resumes from step 0"
    assert not pm.detected and "not detected" in md.read_text()
    assert time.time() - journal.started_at < 120


@pytest.mark.parametrize("torchrun_job", [0], indirect=True)
def test_a_kill_the_job_does_not_recover_from_fails_the_hypothesis_after(
    agent: tuple[AgentEndpoint, Path],  # first: its start-up must not eat the job's steps
    torchrun_job: tuple[str, Path],
) -> None:
    # No hypothesis probe runs after the method: before this fix the after-phase passed
    # vacuously and a kill that ended the job (no restarts left) was "completed".
    job, run_dir = torchrun_job
    endpoint, token = agent
    experiment = parse_experiment(f"""
version: 1
title: kill rank 1 of a job without restarts
job: {{name: {job}, steps: 1000000, checkpoint_every: 10, startup_timeout_seconds: 60}}
steady_state_hypothesis:
  title: both ranks step
  probes:
    - name: ranks-progressing
      provider: {{type: job, expect: progressing, window_seconds: 5}}
      timeout_seconds: 20
      phases: [before]
method:
  - type: action
    name: kill-rank-1
    fault: {{kind: kill_rank, rank: 1, signal: SIGKILL, ttl_seconds: 60}}
""")
    target = Target(
        run_dir=run_dir,
        jobs=AttachedJobs(run_dir, world_size=2),
        world_size=2,
        agents=(endpoint,),
        agent_token_file=token,
    )
    runner = Runner(
        experiment,
        source=Path("inline.yaml"),
        target=target,
        config=RunnerConfig(attach_job=job, recovery_timeout_seconds=8),
    )

    result = asyncio.run(runner.run())

    journal = result.journal
    assert result.exit_code == 1, journal.model_dump_json(indent=2)
    assert journal.status == "deviated" and not journal.hypothesis_held
    assert journal.method[0].status == "succeeded"
    [recovered] = journal.steady_state_after.probes
    assert recovered.name == "job-recovered" and recovered.status == "failed"
    assert recovered.error and "rank" in recovered.error
    assert journal.steady_state_after.met is False
