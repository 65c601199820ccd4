"""End to end: the demo's kill-rank experiment on a real lab (namespaces, torchrun, Prometheus,
Alertmanager, responder), with its own names, subnet and ports so it cannot collide with a
demo or another lab on the same machine.

The lab is the demo's two job nodes with one rank each (the demo's are 2 x 2): the shipped
experiment runs with its job's ``world_size`` and its all-ranks probe's ``tolerance`` set to
the 2 ranks (checked to be the demo lab's 4 as shipped), everything else as shipped. Its kill
of rank 1 then lands on node1, and recovery is torchrun restarting the worker groups of both
nodes across the rendezvous; a sibling rank on the killed rank's node restarting is covered on
a 2 x 2 lab by tests/chaos/test_catalogue_on_lab.py (kill_rank of rank 3). Every worker-group
start here (the baseline, the two experiment jobs and their restarts) imports torch in 2 ranks
instead of 4."""

from __future__ import annotations

import io
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from stormwatch.chaos import ChaosError, load_experiment
from stormwatch.chaos.console import ConsoleReporter
from stormwatch.chaos.gameday.demo import default_experiment, demo_experiment, run_demo
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.target import LabJobs
from stormwatch.contracts.journal import load_journal
from stormwatch.lab import Lab, LabConfig
from stormwatch.telemetry.ranklogs import read_job_logs

pytestmark = pytest.mark.e2e
STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))

E2E_LAB = LabConfig(
    prefix="swchaos",
    subnet=ipaddress.IPv4Network("10.219.0.0/24"),
    prometheus_port=29190,
    alertmanager_port=29193,
    responder_port=29195,
    rdzv_port=29410,
    # The demo's two job nodes without its spare (the shipped playbook answers
    # StormwatchRankStalled with confirm_restart only, which never moves the job): one
    # agent and slurmd fewer (~12 CPU-s of the spare's idle agent in a 3-node run).
    nodes=2,
    # One rank per node: the experiment's subject is detection, recovery and the loss, not
    # ranks sharing a node (module docstring).
    nproc_per_node=1,
)
#: Steps of the demo's jobs (baseline and experiment): 20 after the resume from step 20,
#: so that the after-phase's Prometheus probe still finds the ranks alive (their gauges go
#: with the processes).
DEMO_STEPS = 40
#: The re-run only checks a fresh job and a pass: a shorter copy of the same experiment,
#: the kill after step 15 and again 20 steps after the resume from step 10.
RERUN_STEPS, RERUN_KILL_STEP = 30, 15


@pytest.mark.timeout(1800)
def test_e2e_kill_rank_is_detected_received_recovered_with_identical_loss(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab creates network namespaces (run the e2e tier with sudo)")
    output = io.StringIO()
    reporter = ConsoleReporter(Console(file=output, width=120))
    source = _shaped_copy(default_experiment(), tmp_path / "shaped")
    run_dir = tmp_path / "run"

    try:
        outcome = run_demo(
            run_dir=run_dir,
            # `stormwatch demo --steps 40`: the kill after step 25 and the resume from the
            # step-20 checkpoint as in the shipped file, 20 steps after it instead of 30.
            experiment=demo_experiment(source, DEMO_STEPS),
            source=source,
            lab_config=E2E_LAB,
            keep_lab=True,  # the re-run below uses the same lab
            reporter=reporter,
        )
        first_job = outcome.run.journal.job
        assert first_job is not None
        # The responder's own post-mortem of the stall incident is on disk when the demo
        # returns (it used to be lost to `lab down`, which came ~1 s after the close).
        pages = outcome.incident_postmortems
        assert any("StormwatchRankStalled" in p.read_text() for p in pages), pages
        # The run returned only once its job's torchruns were gone (the next run used to
        # fail with "job 'experiment' is still running").
        codes = Lab(run_dir).job_result(first_job.name).exit_codes
        assert codes and all(c == 0 for c in codes.values()), codes
        rerun = _rerun(_short_copy(source, tmp_path), run_dir)
    finally:
        print(output.getvalue())  # shown by pytest when the test fails
        Lab(run_dir).down(E2E_LAB)  # the config only matters if lab.json is missing

    journal, pm = outcome.run.journal, outcome.postmortem
    report = outcome.postmortem_file.read_text()
    assert outcome.run.exit_code == 0, report
    assert journal.status == "completed" and journal.hypothesis_held, report
    assert pm.alertname == "StormwatchRankStalled" and pm.detected, report
    assert pm.alert_labels.get("rank") == "1", report
    assert pm.alert_received_at is not None, "the responder received the alert\n" + report
    assert pm.recovered and pm.workers_restarted_at is not None, report
    assert pm.resumed_from_step == 20 and pm.steps_lost is not None and pm.steps_lost >= 5, report
    # Steps 21-40 after the restart (25 of 30 asked of the 50-step default: in proportion).
    assert pm.loss.identical is True and pm.loss.compared_steps >= 17, report
    assert journal.steady_state_after.probes[0].name == "job-recovered"
    faults = Ledger(ledger_path(run_dir), create=False).entries()
    assert [(f.state, f.kind) for f in faults] == [("reverted", "kill_rank")] * 2
    assert '"phase": "down"' in (run_dir / "lab.json").read_text()

    # Re-running the experiment against the same lab: a fresh job (new name, new folder,
    # no resumed checkpoint: the first job's last one is at step 40), the kill at step 15
    # of the short copy, and a real pass.
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    second = load_journal(_journal_path(rerun.stderr))
    assert second.job is not None and second.job.name != first_job.name
    assert second.job.name.startswith("experiment-") and first_job.name.startswith("experiment-")
    [action] = second.method[:1]
    assert isinstance(action.output, dict), action.output
    assert RERUN_KILL_STEP <= action.output["step"] < RERUN_STEPS, action.output
    assert second.status == "completed" and second.hypothesis_held
    first_start = read_job_logs(Path(second.job.log_dir))[1].events[0]
    assert first_start.event == "start" and first_start.resumed_from_step is None, "fresh job"
    assert "after: held" in rerun.stderr and "after: None" not in rerun.stderr, rerun.stderr
    # The lab refuses to reuse a job name for an experiment (it would resume that run).
    with pytest.raises(ChaosError, match="already has a job"):
        LabJobs(Lab(run_dir), world_size=E2E_LAB.world_size).start(
            load_experiment(source).job.model_copy(update={"name": first_job.name})
        )


def _shaped_copy(shipped: Path, folder: Path) -> Path:
    """The shipped experiment for :data:`E2E_LAB`'s ranks (its job's ``world_size`` and its
    all-ranks probe's ``tolerance``), written into ``folder`` under the same name."""
    data = yaml.safe_load(shipped.read_text())
    # As shipped, the file fits the demo's lab (2 job nodes x 2 ranks): what is scaled here.
    assert data["job"]["world_size"] == LabConfig().world_size == 4, data["job"]
    [probe] = [
        p
        for p in data["steady_state_hypothesis"]["probes"]
        if p["provider"]["type"] == "prometheus"
    ]
    assert probe["provider"]["tolerance"] == data["job"]["world_size"], probe
    data["job"]["world_size"] = probe["provider"]["tolerance"] = E2E_LAB.world_size
    folder.mkdir()
    shaped = folder / shipped.name
    shaped.write_text(yaml.safe_dump(data, sort_keys=False))
    return shaped


def _short_copy(source: Path, folder: Path) -> Path:
    """The experiment file with :data:`RERUN_STEPS` steps and the kill after
    :data:`RERUN_KILL_STEP` (after the step-10 checkpoint, before the end), written into ``folder``."""
    data = yaml.safe_load(source.read_text())
    data["job"]["steps"] = RERUN_STEPS
    [kill] = [a for a in data["method"] if a["type"] == "action"]
    kill["when"]["step"] = RERUN_KILL_STEP
    short = folder / source.name
    short.write_text(yaml.safe_dump(data, sort_keys=False))
    return short


def _rerun(source: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    """``stormwatch chaos run`` (the lab found through STORMWATCH_LAB_DIR), no post-mortem."""
    return subprocess.run(
        [STORMWATCH, "chaos", "run", str(source), "--no-postmortem"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "STORMWATCH_LAB_DIR": str(run_dir), "COLUMNS": "80"},
    )


def _journal_path(output: str) -> Path:
    """The journal path ``chaos run`` prints last (on one line, whatever its length)."""
    [line] = [line for line in output.splitlines() if line.startswith("journal: ")]
    return Path(line.removeprefix("journal: "))
