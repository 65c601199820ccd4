"""End to end on the Slurm lab: a PyTorch Lightning DDP job (examples/lightning/train.py,
gloo on the CPU, 2 nodes x 1 rank, ``StormwatchCallback``) is watched as the reference
trainer is. Its command replaces ``stormwatch train`` through the one general mechanism
(an experiment's ``job.command`` / ``JobSpec.command``, run by the Slurm recipe as
``STORMWATCH_COMMAND``); nothing here knows it is Lightning.

1. The rank-kill experiment (``stormwatch chaos run``): StormwatchRankStalled names rank 1,
   torchrun restarts the workers, the job resumes from its step-10 checkpoint, and the
   post-mortem reports it, the loss after recovery bitwise that of a fault-free run.
2. A hung rank: rank 1's batches stop coming (``--stall-rank``: a deadlocked data loader;
   alive, in no collective) while its peers wait in their gradient all-reduce.
   StormwatchTrainingHung fires, the lab's responder requeues the Slurm job, which resumes
   from its last checkpoint, and the incident post-mortem names rank 1 from the
   flight-recorder dumps. (Not ``freeze_rank``: Slurm sends SIGCONT before SIGTERM, so a
   stopped rank is running again when the ranks write their dumps, and is no longer behind.)
   Rank 1 is node1's only rank: the post-mortem compares the dumps of every node. This is
   the suite's one end-to-end run of a hang through the responder (Slurm's restart read
   back, the post-mortem's impact, plots and HTML); the reference trainer's own hang
   (``collective_hang``) is tests/chaos/test_catalogue_on_lab.py's and its dumps
   tests/trainer/test_e2e_hang.py's.
3. A slowed rank: the agent's ``cpu_throttle`` fault on rank 1 (a noisy neighbour); the
   expression of StormwatchStraggler (the alert has no ``for``: its windows are the hold;
   as in tests/chaos/test_straggler_alert_e2e.py) names rank 1 and no other.
4. Zero code: the unmodified plain-DDP example (examples/plain_ddp/train.py, no stormwatch
   import) as the job's command under ``stormwatch run``: the lab's agents count its
   collectives, and when rank 1 is stopped (SIGSTOP: no progress, no exit, no handler
   runs) the agent's hang detection fires and names rank 1 from the flight recorders it
   asks the ranks for while the hang lasts. The agent asks only its own node's ranks and
   names the rank that cannot answer while its peers there wait in a collective, so this
   one runs 2 ranks per node, on a Slurm lab of its own (``slurm_lab_two_ranks_per_node``).

Tests 1-3 run on the Slurm lab shared with the other modules of that shape (``slurm_lab``,
tests/slurm_lab.py; one rank per node, a job is ranks 0 and 1): records of other tests'
jobs are told apart by job. Run under
``flock /tmp/stormwatch-e2e.lock``. Each test prints its figures (``-s``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from stormwatch.alerts.rulefiles import rules_dir
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.contracts.journal import load_journal
from stormwatch.lab import JobSpec, Lab
from stormwatch.platforms.slurm import SlurmCommands
from stormwatch.platforms.slurm_readback import in_service
from stormwatch.telemetry.ranklogs import read_job_logs

pytestmark = [pytest.mark.e2e, pytest.mark.root]

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "lightning" / "train.py"
#: Where the hung rank's incident post-mortem (HTML) is kept for a reader.
ARTIFACTS = Path(__file__).resolve().parents[3] / "build" / "test-artifacts"
#: The Lightning job, with the job section's values (placeholders of job.command).
COMMAND = [
    sys.executable, str(EXAMPLE), "--max-steps", "${steps}", "--checkpoint-every",
    "${checkpoint_every}", "--seed", "${seed}", "--step-delay", "${step_delay}",
]  # fmt: skip


def _command(**values: object) -> tuple[str, ...]:
    """:data:`COMMAND` with its placeholders filled in (for jobs started without chaos)."""
    words = " ".join(COMMAND)
    for name, value in values.items():
        words = words.replace("${" + name + "}", str(value))
    return tuple(words.split(" "))


@pytest.fixture
def lab(slurm_lab: Lab) -> Lab:
    """The shared Slurm lab of three nodes (jobs on two, 1 rank each; tests/slurm_lab.py)."""
    return slurm_lab


def _culprit_inputs(lab: Lab, pm: dict[str, Any], logs_dir: Path) -> str:
    """What a post-mortem's culprit was drawn from: its evidence, inputs and notes, the
    dumps on disk and the agents' hang events (a CI run once named no culprit, and its
    output said no more than ``method: unknown``)."""
    lines = [f"culprit evidence: {pm['culprit'].get('evidence')}"]
    lines += [f"input {k}: {v}" for k, v in sorted(pm.get("inputs", {}).items())]
    lines += [f"note: {n}" for n in pm.get("notes", [])]
    for path in sorted((logs_dir / "dumps").glob("*")):
        lines.append(f"dump file {path.name} ({path.stat().st_mtime:.1f})")
    for path in sorted(lab.run_dir.glob("nodes/*/agent/events.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            if '"rank_hang' in line or '"rank_exit' in line:
                lines.append(f"{path.parts[-3]}: {line[:400]}")
    return "\n".join(lines)


def _print_tails(lab: Lab) -> None:
    """The end of the jobs' and the services' logs (shown when a test fails)."""
    run_dir = lab.run_dir
    for path in sorted(run_dir.glob("jobs/*/*.torchrun.log")) + sorted(run_dir.glob("logs/*.log")):
        lines = path.read_text(errors="replace").splitlines()[-20:]
        print(f"--- {path}\n" + "\n".join(lines))


def _chaos_run(lab: Lab, experiment: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [STORMWATCH, "chaos", "run", str(experiment), "--run-dir", str(lab.run_dir), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    print(done.stdout[-5000:], done.stderr[-5000:], sep="\n")
    return done


# --------------------------------------------------------------------------- 1. kill a rank
KILL = f"""\
version: 1
title: Kill rank 1 of a Lightning DDP job; it recovers from its checkpoint
job:
  name: pl-kill
  world_size: 2
  steps: 30
  checkpoint_every: 10
  step_delay: 0.3
  seed: 0
  startup_timeout_seconds: 240
  command: {json.dumps(COMMAND)}
steady_state_hypothesis:
  title: Both ranks make progress and the job finishes
  probes:
    - name: all-ranks-progressing
      provider:
        type: prometheus
        query: >-
          count(time() - max by (rank)
          (stormwatch_train_last_step_timestamp_seconds{{training_job="${{job}}"}}) < 15)
        tolerance: 2
      timeout_seconds: 30
    - name: job-finishes
      provider: {{type: job, expect: finished}}
      timeout_seconds: 300
      phases: [after]
method:
  - type: action
    name: kill-rank-1
    when: {{step: 15, timeout_seconds: 300}}
    fault: {{kind: kill_rank, rank: 1, signal: SIGKILL, ttl_seconds: 120}}
  - type: probe
    name: all-ranks-progressing-again
    provider: {{type: job, expect: progressing, window_seconds: 15}}
    timeout_seconds: 240
rollbacks:
  - {{type: revert, name: revert-experiment-faults}}
"""


@pytest.mark.timeout(900)
def test_a_killed_rank_of_a_lightning_job_is_detected_restarted_resumed_and_reported(
    lab: Lab, tmp_path: Path
) -> None:
    started = time.monotonic()
    # The fault-free run the post-mortem compares the loss with (no step delay: the same
    # losses, sooner).
    base = _command(steps=30, checkpoint_every=10, seed=0, step_delay=0.0)
    lab.start_job(JobSpec(name="pl-base", command=base))
    assert lab.wait_job("pl-base", timeout=300).ok
    baseline_s = time.monotonic() - started
    experiment = tmp_path / "kill-lightning-rank.yaml"
    experiment.write_text(KILL)
    try:
        done = _chaos_run(lab, experiment, "--baseline-job", "pl-base", "--wait-resolved", "60")
    except BaseException:
        _print_tails(lab)
        raise
    [line] = [x for x in (done.stdout + done.stderr).splitlines() if x.startswith("journal: ")]
    journal_path = Path(line.removeprefix("journal: "))
    journal = load_journal(journal_path)
    if done.returncode != 0:
        _print_tails(lab)
    assert done.returncode == 0, done.stderr[-3000:]
    assert journal.status == "completed" and journal.hypothesis_held and journal.rollbacks_ok
    assert journal.job is not None and journal.job.name.startswith("pl-kill-")
    record = lab.state.jobs[journal.job.name]
    assert record.info.slurm_job_id is not None  # a Slurm job, as the trainer's are
    assert record.info.spec.command is not None and str(EXAMPLE) in record.info.spec.command
    pm = json.loads((journal_path.parent / "postmortem.json").read_text())
    assert pm["alertname"] == "StormwatchRankStalled" and pm["detected"], pm
    assert pm["alert_labels"].get("rank") == "1", pm
    assert pm["recovered"] and pm["resumed_from_step"] == 10, pm
    assert pm["steps_lost"] is not None and pm["steps_lost"] >= 5, pm
    assert pm["loss"]["identical"] is True and pm["loss"]["compared_steps"] >= 20, pm["loss"]
    # Lightning's .ckpt files are verified too (they were reported "no complete checkpoint").
    checked = json.loads((journal_path.parent / "verification.json").read_text())["checkpoint"]
    assert checked["ok"] is True and ".ckpt (torch.save" in checked["detail"], checked
    faults = Ledger(ledger_path(lab.run_dir), create=False).entries()
    assert [f.state for f in faults if f.kind == "kill_rank"] == ["reverted"]
    print(
        f"FIGURES lightning kill-rank: baseline {baseline_s:.0f} s, experiment "
        f"{time.monotonic() - started - baseline_s:.0f} s; time to detect "
        f"{pm['time_to_detect_seconds']:.1f} s, to recover {pm['time_to_recover_seconds']:.1f} s, "
        f"steps lost {pm['steps_lost']}, loss identical over {pm['loss']['compared_steps']} steps"
    )


# --------------------------------------------------------------------------- 2. a hung rank
@pytest.mark.timeout(900)
def test_fc10_a_hung_rank_of_a_lightning_job_is_detected_and_named_from_the_flight_recorder(
    lab: Lab, wait_for: Callable[..., Any], lab_responder: Callable[..., list[dict[str, Any]]]
) -> None:
    started = time.monotonic()
    # Stalls before step 8, resumes from the step-5 checkpoint: 16 steps pass one more.
    command = _command(steps=16, checkpoint_every=5, seed=0, step_delay=0.2)
    info = lab.start_job(
        JobSpec(name="pl-hang", command=(*command, "--stall-rank", "1", "--stall-at-step", "8"))
    )
    logs_dir = Path(info.log_dir)

    def stalled_at() -> float | None:  # rank 0 reached step 7 and nobody stepped for 5 s
        logs = read_job_logs(logs_dir)
        steps = [e for log in logs.values() for e in log.steps]
        last = max((e.time for e in steps), default=0.0)
        reached = max((e.step or 0 for e in steps), default=0)
        return last if reached >= 7 and time.time() - last > 5 else None

    try:
        hung_at = wait_for(stalled_at, 240, "rank 1 to stall at step 8 (no step for 5 s)", 0.5)

        def restarts() -> list[dict[str, Any]]:  # of this job's incidents
            ours = {
                i["id"]
                for i in lab_responder(lab, "incidents")
                if i["labels"].get("training_job") == "pl-hang"
            }
            return [
                a
                for a in lab_responder(lab, "actions")
                if a["kind"] == "restart_workers"
                and a["incident_id"] in ours
                and a["status"] in ("succeeded", "failed")
            ]

        [restart] = wait_for(
            restarts,
            180,
            "the responder to restart the hung job",
            1.0,
        )
        assert restart["status"] == "succeeded", restart
        assert restart["detail"].startswith(f"requeued Slurm job {info.slurm_job_id} "), restart
        assert lab.state.slurm is not None and info.slurm_job_id is not None
        slurm = SlurmCommands(conf=lab.state.slurm.conf)
        assert slurm.job(info.slurm_job_id).restarts == 1  # the restart went through Slurm
        result = lab.wait_job("pl-hang", timeout=300)
        assert result.ok, result
        pm_root = lab.paths.responder_dir / "postmortems"

        def hang_postmortem() -> dict[str, Any] | None:
            for path in pm_root.glob("incident-*/postmortem.json"):
                pm = json.loads(path.read_text())
                hung = pm["alertname"] == "StormwatchTrainingHung" and pm["status"] == "closed"
                hung = hung and pm["job"] == "pl-hang"
                if hung and pm["recovered_at"] is not None:
                    return dict(pm)
            return None

        pm = wait_for(hang_postmortem, 120, "the hang incident's post-mortem", 1.0)
    except BaseException:
        _print_tails(lab)
        raise

    logs = read_job_logs(logs_dir)
    restarted = logs[1].starts[1:]
    assert restarted and restarted[0].resumed_from_step == 5, logs[1].starts
    assert all(log.finished for log in logs.values())
    hung_at_step = max(e.step or 0 for e in logs[0].steps if e.time < restarted[0].time)
    culprit = pm["culprit"]
    print(_culprit_inputs(lab, pm, logs_dir))  # shown when an assertion below fails
    assert (culprit["rank"], culprit["node"]) == (1, "node1"), culprit
    assert culprit["method"] == "flight_recorder" and culprit["certain"], culprit
    assert culprit["chaos_fault_rank"] is None  # no journal: the dumps alone named it
    assert pm["impact"]["resumed_from_step"] == 5
    assert pm["impact"]["steps_lost"] == hung_at_step - 5
    assert pm["time_to_detect_seconds"] is not None and pm["time_to_recover_seconds"] is not None
    assert any(a.startswith("restart_workers: succeeded") for a in pm["actions"])
    assert [p["source"] for p in pm["plots"]] == ["prometheus"] * 3  # the lab's Prometheus
    folder = pm_root / f"incident-{pm['incident_id']}"
    assert (folder / "postmortem.html").stat().st_size > 10_000
    ARTIFACTS.mkdir(parents=True, exist_ok=True)  # the real lab's report, for a reader
    shutil.copy(folder / "postmortem.html", ARTIFACTS / "hung-rank-postmortem.html")
    print(
        f"FIGURES lightning hung rank: {time.monotonic() - started:.0f} s; alert -> restart "
        f"{pm['time_to_detect_seconds']:.1f} s after the last step ({hung_at:.0f}), recovered "
        f"after {pm['time_to_recover_seconds']:.1f} s; culprit: {culprit['evidence'][0]}"
    )


# --------------------------------------------------------------------------- 3. a slow rank
SLOW = f"""\
version: 1
title: "Slow rank: rank 1 of a Lightning job gets a tenth of a CPU"
job:
  name: pl-slow
  world_size: 2
  steps: 100000
  checkpoint_every: 100000
  step_delay: 0.0
  seed: 0
  startup_timeout_seconds: 240
  command: {json.dumps(COMMAND)}
steady_state_hypothesis:
  title: Prometheus scrapes the compute time of both ranks
  probes:
    - name: all-ranks-scraped
      provider:
        type: prometheus
        query: count(stormwatch_train_compute_seconds_total{{training_job="${{job}}"}})
        tolerance: 2
      timeout_seconds: 60
      phases: [before]
method:
  # Step 300, not 20: a 2-rank job of this small model steps at tens of steps a second
  # (alone it was at step 25 when the run first saw both ranks stepping, polled every
  # 0.5 s, and refused a when.step already behind); 300 costs seconds before the throttle.
  - type: action
    name: throttle-rank-1
    when: {{step: 300, timeout_seconds: 240}}
    fault: {{kind: cpu_throttle, rank: 1, cpu_fraction: 0.1, ttl_seconds: 240}}
  - {{type: pause, name: hold-while-the-test-queries, seconds: 240}}
expect: {{detect: false, loss: skip}}
"""


def _give_back_excluded_nodes(lab: Lab) -> None:
    """Resume the nodes the responder drained for a straggler (the shared lab's policy:
    StormwatchStraggler -> exclude_node_restart). The alert has no ``for`` since issue 18, so
    it fires while the test runs (here ~17 s after the throttle) and the responder excludes
    rank 1's node; the shared lab must be left with every node in service."""
    assert lab.state.slurm is not None
    slurm = SlurmCommands(conf=lab.state.slurm.conf)
    for node in slurm.nodes().values():
        if not in_service(node) and "stormwatch: excluded from job" in (node.reason_text or ""):
            slurm.update_node(node.name, "RESUME")


def _straggler_expr() -> str:
    """The ``expr`` of StormwatchStraggler in alerts/rules/training.yml (without ``for``)."""
    groups = yaml.safe_load((rules_dir() / "training.yml").read_text())["groups"]
    [rule] = [r for g in groups for r in g["rules"] if r.get("alert") == "StormwatchStraggler"]
    return str(rule["expr"])


@pytest.mark.timeout(600)
def test_fc14_a_throttled_rank_of_a_lightning_job_is_named_by_the_straggler_alert(
    lab: Lab, tmp_path: Path, wait_for: Callable[..., Any]
) -> None:
    started = time.monotonic()
    straggler = _straggler_expr()
    experiment = tmp_path / "slow-lightning-rank.yaml"
    experiment.write_text(SLOW)
    log = tmp_path / "chaos-run.log"
    named: list[set[str]] = []
    with log.open("w") as out:
        run = [STORMWATCH, "chaos", "run", str(experiment), "--run-dir", str(lab.run_dir)]
        controller = subprocess.Popen(
            [*run, "--no-postmortem"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "100"},
        )
    try:
        injected = wait_for(
            lambda: next(
                (
                    e
                    for e in Ledger(ledger_path(lab.run_dir)).entries()
                    if e.kind == "cpu_throttle" and e.state == "injected"
                ),
                None,
            ),
            300,
            "the cpu_throttle fault on rank 1",
            0.5,
        )
        prometheus = lab.prometheus()

        job = injected.target.job  # the shared lab's Prometheus also holds other tests' jobs

        def rank_1_named_thrice() -> bool:
            samples = prometheus.query(straggler)
            ranks = {s.labels["rank"] for s in samples if s.labels.get("training_job") == job}
            if ranks:
                named.append(ranks)
            return sum("1" in r for r in named) >= 3

        wait_for(rank_1_named_thrice, 120, "StormwatchStraggler's expression to name rank 1", 1.0)
        named_after = time.time() - (injected.injected_at or 0)
    except BaseException:
        _print_tails(lab)
        raise
    finally:
        controller.send_signal(signal.SIGINT)  # the experiment reverts its fault, stops its job
        try:
            code = controller.wait(timeout=120)
        except subprocess.TimeoutExpired:
            controller.kill()
            code = controller.wait()
        print(log.read_text()[-4000:])
        _give_back_excluded_nodes(lab)
    assert named and all(ranks == {"1"} for ranks in named), named
    assert code == 130, "chaos run ends as interrupted"
    [entry] = [e for e in Ledger(ledger_path(lab.run_dir)).entries() if e.kind == "cpu_throttle"]
    assert (entry.spec.target_rank(), entry.state) == (1, "reverted")
    print(
        f"FIGURES lightning straggler: {time.monotonic() - started:.0f} s; rank 1 named "
        f"{named_after:.0f} s after the throttle; samples: {named}"
    )


# --------------------------------------------------------------------------- 4. zero code
PLAIN = Path(__file__).resolve().parents[3] / "examples" / "plain_ddp" / "train.py"


def _rank_process(job: str, rank: int) -> psutil.Process | None:
    """The live process of ``rank`` of ``job`` (its environment says so; not torchrun)."""
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            ours = env.get("STORMWATCH_JOB") == job and env.get("RANK") == str(rank)
            if ours and str(PLAIN) in proc.cmdline():
                return proc
        except psutil.Error:
            continue
    return None


def _agent_events(lab: Lab, kind: str, job: str) -> list[dict[str, Any]]:
    """The ``kind`` events of ``job`` in every lab agent's event log."""
    found = []
    for node in lab.state.nodes:
        path = lab.paths.node_state(node.name) / "events.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        events = (json.loads(line) for line in lines if line.strip())
        found += [e for e in events if e.get("kind") == kind and e.get("job") == job]
    return found


@pytest.mark.timeout(300)
def test_fc10_an_unmodified_ddp_job_under_stormwatch_run_on_the_lab_is_counted_and_its_hang_named(
    slurm_lab_two_ranks_per_node: Lab, wait_for: Callable[..., Any]
) -> None:
    lab = slurm_lab_two_ranks_per_node  # ranks 0 and 1 on node0: node0's agent asks both
    started = time.monotonic()
    command = (STORMWATCH, "run", "--", sys.executable, str(PLAIN), "--steps", "100000",
               "--step-delay", "0.05")  # fmt: skip
    info = lab.start_job(JobSpec(name="zc-lab", command=command))
    job = "zc-lab"
    node0 = lab.state.node("node0")
    try:

        def counted() -> dict[str, float] | None:  # all-reduces of rank 0 and 1 on node0
            with urllib.request.urlopen(f"{node0.agent_url}/metrics", timeout=5) as reply:
                text = reply.read().decode()
            calls = {}
            for line in text.splitlines():
                if (
                    line.startswith("stormwatch_collective_calls_total{")
                    and f'training_job="{job}"' in line
                ):
                    rank = line.split('rank="', 1)[1].split('"', 1)[0]
                    calls[rank] = calls.get(rank, 0.0) + float(line.rsplit(" ", 1)[1])
            return calls if len(calls) == 2 and min(calls.values()) >= 10 else None

        calls = wait_for(counted, 180, "node0's agent to count both ranks' collectives", 1.0)
        victim = wait_for(lambda: _rank_process(job, 1), 30, "rank 1's process", 0.5)
        victim.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            [culprit] = wait_for(  # node0's agent: it asks ranks 0 and 1
                lambda: [
                    e
                    for e in _agent_events(lab, "rank_hang_culprit", job)
                    if 1 in (e.get("asked") or [])
                ],
                120,
                "node0's agent to name the hung job's culprit",
                1.0,
            )
            named_after = time.monotonic() - stopped_at
        finally:
            victim.send_signal(signal.SIGCONT)
    except BaseException:
        _print_tails(lab)
        raise
    finally:
        lab.stop_job(job, grace=5.0)
    assert culprit["rank"] == 1 and culprit["pid"] == victim.pid, culprit
    assert culprit["method"] == "flight_recorder" and culprit["certain"], culprit
    assert 1 not in culprit["answered"] and 0 in culprit["answered"], culprit
    others = _agent_events(lab, "rank_hang_culprit", job)  # node1's, from ranks 2 and 3
    assert all(e["rank"] == 1 for e in others), others
    assert info.slurm_job_id is not None  # through the Slurm recipe, as every lab job
    print(
        f"FIGURES zero code on the lab: {time.monotonic() - started:.0f} s; collectives "
        f"counted {calls}; culprit rank 1 named {named_after:.1f} s after SIGSTOP "
        f"(asked {culprit['asked']}, answered {culprit['answered']})"
    )
