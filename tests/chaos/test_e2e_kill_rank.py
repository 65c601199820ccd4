"""End to end: the demo's kill-rank experiment on a real lab (namespaces, torchrun, Prometheus,
Alertmanager, responder), with its own names, subnet and ports so it cannot collide with a
demo or another lab on the same machine."""

from __future__ import annotations

import io
import ipaddress
import os
from pathlib import Path

import pytest
from rich.console import Console

from stormwatch.chaos.console import ConsoleReporter
from stormwatch.chaos.demo import default_experiment, demo_experiment, run_demo
from stormwatch.chaos.lab import LabConfig
from stormwatch.chaos.ledger import Ledger, ledger_path

pytestmark = pytest.mark.e2e

E2E_LAB = LabConfig(
    prefix="swchaos",
    subnet=ipaddress.IPv4Network("10.219.0.0/24"),
    prometheus_port=29190,
    alertmanager_port=29193,
    responder_port=29195,
    rdzv_port=29410,
)


@pytest.mark.timeout(1200)
def test_e2e_kill_rank_is_detected_received_recovered_with_identical_loss(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab creates network namespaces (run the e2e tier with sudo)")
    output = io.StringIO()
    reporter = ConsoleReporter(Console(file=output, width=120))
    source = default_experiment()
    run_dir = tmp_path / "run"

    try:
        outcome = run_demo(
            run_dir=run_dir,
            experiment=demo_experiment(source, None),
            source=source,
            lab_config=E2E_LAB,
            keep_lab=False,
            reporter=reporter,
        )
    finally:
        print(output.getvalue())  # shown by pytest when the test fails

    journal, pm = outcome.run.journal, outcome.postmortem
    report = outcome.postmortem_file.read_text()
    assert outcome.run.exit_code == 0, report
    assert journal.status == "completed" and journal.hypothesis_held, report
    assert pm.alertname == "StormwatchRankStalled" and pm.detected, report
    assert pm.alert_labels.get("rank") == "1", report
    assert pm.alert_received_at is not None, "the responder received the alert\n" + report
    assert pm.recovered and pm.workers_restarted_at is not None, report
    assert pm.resumed_from_step == 20 and pm.steps_lost is not None and pm.steps_lost >= 5, report
    assert pm.loss.identical is True and pm.loss.compared_steps >= 25, report
    [fault] = Ledger(ledger_path(run_dir), create=False).entries()
    assert fault.state == "reverted" and fault.kind == "kill_rank"
    assert (
        not (run_dir / "lab.json").exists()
        or '"phase": "down"' in (run_dir / "lab.json").read_text()
    )
