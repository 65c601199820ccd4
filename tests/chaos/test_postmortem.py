"""Post-mortems from recorded inputs: journal, rank logs, baseline log, alert/responder evidence."""

from __future__ import annotations

import asyncio
import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stormwatch.chaos.reports.evidence import AlertEvidence, Evidence, save_evidence
from stormwatch.chaos.reports.report import generate_postmortem, postmortem_from_files
from stormwatch.contracts.journal import (
    ActivityRecord,
    JobRef,
    Journal,
    SteadyState,
    write_journal,
)
from stormwatch.contracts.responder import IncidentMember, IncidentRecord, NotificationRecord
from stormwatch.postmortem import ExperimentPostMortem, experiment_document, render_markdown
from stormwatch.telemetry.dump import DumpRecord, dump_path

STORMWATCH = Path(sys.executable).with_name("stormwatch")
T0 = 1_700_000_000.0
STEP = 0.4
FAULT_AT = T0 + 25 * STEP + 0.1  # just after step 25 completed
RESTART_AT = FAULT_AT + 5.0
RESUMED_AT = RESTART_AT + 3.0  # first step after resume (step 21)


def _markdown(pm: ExperimentPostMortem) -> str:
    """The experiment's ``postmortem.md`` text."""
    return render_markdown(experiment_document(pm))


def _loss(step: int) -> float:
    return 5.0 / (1.0 + step)


def _write_logs(
    log_dir: Path,
    *,
    fault: bool,
    tamper: dict[int, float] | None = None,
    attempt_after: dict[int, int] | None = None,
) -> None:
    """Four ranks' JSON lines as the trainer writes them; with ``fault`` rank 1 dies after step 25.

    ``attempt_after`` maps rank -> TORCHELASTIC_RESTART_COUNT after the restart (default 1).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(4):
        lines = [
            {
                "event": "start",
                "time": T0 - 1,
                "rank": rank,
                "attempt": 0,
                "resumed_from_step": None,
            }
        ]
        last = 25 if fault else 50
        for step in range(1, last + 1):
            loss = _loss(step)
            lines.append(
                {
                    "event": "step",
                    "time": T0 + step * STEP,
                    "step": step,
                    "loss": loss,
                    "loss_hex": loss.hex(),
                    "attempt": 0,
                    "step_seconds": STEP,
                }
            )
            if step % 10 == 0:
                lines.append(
                    {"event": "checkpoint", "time": T0 + step * STEP, "step": step, "attempt": 0}
                )
        attempt = (attempt_after or {}).get(rank, 1)
        if fault:
            lines.append(
                {
                    "event": "start",
                    "time": RESTART_AT + rank * 0.01,
                    "rank": rank,
                    "attempt": attempt,
                    "resumed_from_step": 20,
                }
            )
            for i, step in enumerate(range(21, 51)):
                loss = (tamper or {}).get(step, _loss(step))
                lines.append(
                    {
                        "event": "step",
                        "time": RESUMED_AT + i * STEP,
                        "step": step,
                        "loss": loss,
                        "loss_hex": loss.hex(),
                        "attempt": attempt,
                        "step_seconds": STEP,
                    }
                )
        end = (RESUMED_AT + 30 * STEP) if fault else T0 + 50 * STEP
        lines.append({"event": "done", "time": end, "step": 50, "attempt": attempt if fault else 0})
        text = "\n".join(json.dumps(line) for line in lines) + "\n"
        (log_dir / f"rank{rank}.jsonl").write_text(text + '{"event": "step", "ti')  # torn line


def _journal(run_dir: Path, log_dir: Path, *, fault: bool = True) -> Path:
    exp_dir = run_dir / "experiments" / "exp-1"
    probe = ActivityRecord(
        name="all-ranks-progressing",
        type="probe",
        phase="before",
        status="succeeded",
        start=T0 + 2,
        end=T0 + 3,
    )
    after = ActivityRecord(
        name="all-ranks-progressing",
        type="probe",
        phase="after",
        status="succeeded",
        start=RESUMED_AT,
        end=RESUMED_AT + 1,
    )
    method = []
    if fault:
        method.append(
            ActivityRecord(
                name="kill-rank-1",
                type="action",
                phase="method",
                status="succeeded",
                start=T0 + 3,
                end=FAULT_AT,
                output={
                    "fault_id": "exp-1.kill-rank-1",
                    "kind": "kill_rank",
                    "rank": 1,
                    "node": "node0",
                    "target_pid": 4242,
                    "applied_at": FAULT_AT,
                    "expires_at": FAULT_AT + 120,
                    "step": 25,
                    "attempt": 0,
                    "detail": "SIGKILL to rank 1 (pid 4242) on node0",
                },
            )
        )
    journal = Journal(
        experiment_id="exp-1",
        title="Kill rank 1",
        file=Path("kill-rank.yaml"),
        experiment={},
        status="completed",
        started_at=T0,
        ended_at=FAULT_AT + 50,
        job=JobRef(name="experiment", log_dir=log_dir, world_size=4, started_by_runner=True),
        steady_state_before=SteadyState(met=True, probes=[probe]),
        method=method,
        steady_state_after=SteadyState(met=True, probes=[after]),
        rollbacks_ok=True,
    )
    write_journal(journal, exp_dir / "journal.json")
    return exp_dir


def _evidence(*, alert: bool = True, responder: bool = True) -> Evidence:
    labels = {
        "alertname": "StormwatchRankStalled",
        "training_job": "experiment",
        "rank": "1",
        "severity": "critical",
    }
    evidence = Evidence(window_start=T0 - 60, window_end=RESUMED_AT + 60)
    if alert:
        evidence.alerts = [
            # Fired before the fault and for another job: never the experiment's alert.
            AlertEvidence(
                alertname="StormwatchRankStalled",
                labels={**labels, "training_job": "other"},
                firing_at=FAULT_AT + 1.0,
            ),
            AlertEvidence(
                alertname="Old", labels={"alertname": "Old"}, firing_at=T0 - 30, resolved_at=T0 - 20
            ),
            AlertEvidence(
                alertname="StormwatchRankStalled",
                labels=labels,
                firing_at=FAULT_AT + 2.0,
                resolved_at=FAULT_AT + 40.0,
            ),
        ]
    if responder:
        group_key = '{}:{alertname="StormwatchRankStalled"}'
        member = IncidentMember(
            fingerprint="f1",
            alertname="StormwatchRankStalled",
            status="resolved",
            labels=labels,
            annotations={},
            group_key=group_key,
            starts_at=FAULT_AT + 2.0,
            ends_at=FAULT_AT + 40.0,
            joined_at=FAULT_AT + 3.5,
            resolved_at=FAULT_AT + 41.0,
        )
        evidence.incidents = [
            IncidentRecord(
                id=1,
                alertname="StormwatchRankStalled",
                status="closed",
                labels=labels,
                annotations={},
                group_key=group_key,
                group_labels={"alertname": "StormwatchRankStalled"},
                starts_at=FAULT_AT + 2.0,
                opened_at=FAULT_AT + 3.5,
                closed_at=FAULT_AT + 41.0,
                ends_at=FAULT_AT + 40.0,
                first_alert=member,
                first_alert_tied=False,
                members=[member],
            )
        ]
        evidence.notifications = [
            NotificationRecord(
                id=1,
                received_at=FAULT_AT + 3.5,
                group_key=evidence.incidents[0].group_key,
                status="firing",
                receiver="stormwatch-responder",
                alerts=1,
                new_alerts=1,
            ),
            NotificationRecord(
                id=2,
                received_at=FAULT_AT + 41.0,
                group_key=evidence.incidents[0].group_key,
                status="resolved",
                receiver="stormwatch-responder",
                alerts=1,
                new_alerts=1,
            ),
        ]
    return evidence


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(experiment dir, experiment log dir, baseline log dir) of a recorded kill-rank run."""
    run_dir = tmp_path / "run"
    logs = run_dir / "jobs" / "experiment" / "logs"
    baseline = run_dir / "jobs" / "baseline" / "logs"
    _write_logs(logs, fault=True)
    _write_logs(baseline, fault=False)
    return _journal(run_dir, logs), logs, baseline


def test_full_timeline_detect_recover_steps_lost_and_identical_loss(
    recorded: tuple[Path, Path, Path],
) -> None:
    exp_dir, _, baseline = recorded
    pm = postmortem_from_files(exp_dir, evidence=_evidence(), baseline_log_dir=baseline)

    assert pm.fault_rank == 1 and pm.fault_node == "node0" and pm.fault_at == FAULT_AT
    assert (
        pm.alertname == "StormwatchRankStalled" and pm.alert_labels["training_job"] == "experiment"
    )
    assert pm.detected and pm.time_to_detect_seconds == pytest.approx(2.0)
    # offsets, not Unix times (approx's relative tolerance of a Unix time is ~30 minutes)
    assert pm.alert_received_at - FAULT_AT == pytest.approx(3.5)
    # Prometheus's resolve (40 s), not the responder's incident close a notification later
    # (41 s): the same figure as the responder's own post-mortem (fresh-user pass)
    assert pm.alert_resolved_at - FAULT_AT == pytest.approx(40.0)
    assert pm.workers_restarted_at - FAULT_AT == pytest.approx(RESTART_AT - FAULT_AT)
    assert pm.recovered and pm.time_to_recover_seconds == pytest.approx(RESUMED_AT - FAULT_AT)
    assert (pm.last_step_before_fault, pm.resumed_from_step, pm.steps_lost) == (25, 20, 5)
    assert pm.first_step_after_resume == 21
    assert pm.loss.identical is True and pm.loss.compared_steps == 30 and pm.loss.from_step == 21
    assert [e.event for e in pm.timeline] == [
        "experiment started",
        "steady state before: held",
        "fault injected",
        "alert firing",
        "alert received by the responder",
        "restarted workers began training",
        "first completed step after resume",
        "steady state after: held",
        "alert resolved",
        "experiment ended",
    ]
    assert pm.notes == []
    resolved = next(e for e in pm.timeline if e.event == "alert resolved")
    assert (resolved.source, pm.alert_resolved_source) == ("prometheus", "prometheus")
    md = _markdown(pm)
    assert "| time to detect (fault → alert firing) | 2.0 s |" in md
    assert "| steps lost | 5 |" in md
    assert "Bitwise identical to the baseline at all 30 steps from step 21" in md
    assert "+2.0 s | alert firing" in md


def test_a_resolve_prometheus_did_not_see_is_the_responder_s_close_and_sourced_so(
    recorded: tuple[Path, Path, Path],
) -> None:
    """The row named one source, "responder/prometheus", whichever told it (fresh-user pass:
    the responder's own report says "prometheus")."""
    exp_dir, _, baseline = recorded
    evidence = _evidence()
    # the range query ended before the resolve
    evidence.alerts[-1] = evidence.alerts[-1].model_copy(update={"resolved_at": None})
    pm = postmortem_from_files(exp_dir, evidence=evidence, baseline_log_dir=baseline)
    assert pm.alert_resolved_at is not None
    assert pm.alert_resolved_at - FAULT_AT == pytest.approx(41.0)  # the incident's close
    resolved = next(e for e in pm.timeline if e.event == "alert resolved")
    assert (resolved.source, pm.alert_resolved_source) == ("responder", "responder")


def test_recovery_is_found_when_rank0_node_keeps_its_restart_count(tmp_path: Path) -> None:
    """torchrun counts restarts per node: a node restarted because the *other* node failed
    keeps TORCHELASTIC_RESTART_COUNT 0, so recovery must be read from ``start`` events."""
    run_dir = tmp_path / "run"
    logs = run_dir / "jobs" / "experiment" / "logs"
    baseline = run_dir / "jobs" / "baseline" / "logs"
    _write_logs(logs, fault=True, attempt_after={0: 0, 1: 0, 2: 1, 3: 1})
    _write_logs(baseline, fault=False)
    pm = postmortem_from_files(
        _journal(run_dir, logs), evidence=_evidence(), baseline_log_dir=baseline
    )
    assert pm.recovered and pm.workers_restarted_at == pytest.approx(RESTART_AT)
    assert (pm.resumed_from_step, pm.steps_lost, pm.first_step_after_resume) == (20, 5, 21)
    assert pm.loss.identical is True and pm.loss.compared_steps == 30


def test_alert_never_fired_says_not_detected(recorded: tuple[Path, Path, Path]) -> None:
    exp_dir, _, baseline = recorded
    pm = postmortem_from_files(
        exp_dir, evidence=_evidence(alert=False, responder=False), baseline_log_dir=baseline
    )

    assert not pm.detected and pm.time_to_detect_seconds is None
    assert pm.alert_received_at is None and pm.alert_resolved_at is None
    assert pm.recovered and pm.steps_lost == 5, "recovery is still measured"
    assert any("no alert fired" in n and "not detected" in n for n in pm.notes)
    md = _markdown(pm)
    assert "| time to detect (fault → alert firing) | not detected |" in md
    assert "| not observed |  | alert firing |" in md


def test_alert_known_only_to_the_responder_still_counts_as_detected(
    recorded: tuple[Path, Path, Path],
) -> None:
    exp_dir, _, baseline = recorded
    evidence = _evidence(alert=False)
    evidence.prometheus_error = "GET http://127.0.0.1:19090/api/v1/query_range: refused"
    pm = postmortem_from_files(exp_dir, evidence=evidence, baseline_log_dir=baseline)
    assert pm.detected and pm.time_to_detect_seconds == pytest.approx(2.0)
    assert pm.alert_received_at == pytest.approx(FAULT_AT + 3.5)
    assert any("Prometheus could not be queried" in n for n in pm.notes)


def test_mismatching_loss_lists_every_differing_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    logs, baseline = (
        run_dir / "jobs" / "experiment" / "logs",
        run_dir / "jobs" / "baseline" / "logs",
    )
    _write_logs(logs, fault=True, tamper={23: _loss(23) + 1e-7, 40: 9.0})
    _write_logs(baseline, fault=False)
    exp_dir = _journal(run_dir, logs)

    pm = postmortem_from_files(exp_dir, evidence=_evidence(), baseline_log_dir=baseline)

    assert pm.loss.identical is False
    assert [m.step for m in pm.loss.mismatches] == [23, 40]
    assert pm.loss.mismatches[0].baseline_hex == _loss(23).hex()
    assert pm.loss.mismatches[0].experiment_hex == (_loss(23) + 1e-7).hex()
    md = _markdown(pm)
    assert "**2 of 30 steps differ**" in md and f"| 23 | `{_loss(23).hex()}` |" in md
    assert "| loss identical to baseline after recovery | **no** (30 steps compared" in md


def test_without_baseline_or_fault_the_report_says_what_it_could_not_do(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    logs = run_dir / "jobs" / "experiment" / "logs"
    _write_logs(logs, fault=False)
    exp_dir = _journal(run_dir, logs, fault=False)

    pm = postmortem_from_files(exp_dir, evidence=None, baseline_log_dir=None)

    assert pm.fault_at is None and not pm.detected and not pm.recovered
    assert pm.loss.identical is None and "no baseline" in pm.loss.note
    assert any("no fault was injected" in n for n in pm.notes)
    md = _markdown(pm)
    assert "not detected" in md
    assert "Not compared: no baseline run given\n" in md + "\n"
    assert "loss not compared" not in md  # said once, by the heading's "Not compared"


def test_missing_baseline_log_is_noted(recorded: tuple[Path, Path, Path], tmp_path: Path) -> None:
    exp_dir, _, _ = recorded
    pm = postmortem_from_files(exp_dir, evidence=_evidence(), baseline_log_dir=tmp_path / "nope")
    assert pm.loss.identical is None
    assert any("baseline log" in n and "missing" in n for n in pm.notes)


def test_offline_postmortem_from_saved_evidence_writes_md_and_json(
    recorded: tuple[Path, Path, Path],
) -> None:
    exp_dir, _, baseline = recorded
    save_evidence(_evidence(), exp_dir / "evidence.json")

    pm, md = asyncio.run(generate_postmortem(exp_dir, target=None, baseline_log_dir=baseline))
    cli = subprocess.run(
        [
            str(STORMWATCH),
            "chaos",
            "postmortem",
            str(exp_dir),
            "--offline",
            "--baseline-log-dir",
            str(baseline),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert md == exp_dir / "postmortem.md" and md.exists()
    saved = json.loads((exp_dir / "postmortem.json").read_text())
    assert saved["steps_lost"] == 5 and saved["loss"]["identical"] is True
    assert saved["time_to_detect_seconds"] == pytest.approx(2.0)
    assert pm.detected
    assert cli.returncode == 0, cli.stderr
    assert "# Post-mortem: Kill rank 1" in cli.stdout
    # piped (`> pm.md`): the file's Markdown itself, table rows unwrapped (fresh-user pass:
    # rows were cut at 80 columns)
    assert cli.stdout == md.read_text()
    png = exp_dir / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "![loss per step, experiment vs baseline](loss.png)" in md.read_text()

    # Rewritten without --baseline-log-dir (fresh-user pass: the demo's "loss identical:
    # yes" became "n/a, no baseline run given"): the last post-mortem's baseline is reused
    again = subprocess.run(
        [str(STORMWATCH), "chaos", "postmortem", str(exp_dir), "--offline"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"loss compared with {baseline}" in again.stderr
    rewritten = json.loads((exp_dir / "postmortem.json").read_text())
    assert rewritten["loss"]["identical"] is True and rewritten["loss"]["compared_steps"] == 30


def _slowed_logs(log_dir: Path, *, stall: tuple[float, float]) -> None:
    """Four ranks stepping every STEP s from T0, none between ``stall`` (a partition that
    heals), no restart."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(4):
        lines: list[dict[str, object]] = [
            {
                "event": "start",
                "time": T0 - 1,
                "rank": rank,
                "attempt": 0,
                "resumed_from_step": None,
            }
        ]
        t, step = T0, 0
        while step < 50:
            t += STEP
            if stall[0] < t < stall[1]:
                t = stall[1] + 0.05 * (rank + 1)  # each rank's first step after the heal
            step += 1
            loss = _loss(step)
            lines.append(
                {
                    "event": "step",
                    "time": t,
                    "step": step,
                    "loss": loss,
                    "loss_hex": loss.hex(),
                    "attempt": 0,
                    "step_seconds": STEP,
                }
            )
        (log_dir / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_fault_that_does_not_restart_the_job_recovers_when_removed(tmp_path: Path) -> None:
    """No restart: recovered when every rank has stepped after the ledger's revert."""
    from stormwatch.contracts.fault_ledger import FaultTarget, LedgerEntry
    from stormwatch.contracts.journal import load_journal
    from stormwatch.faults import REGISTRY

    healed = FAULT_AT + 20.0
    log_dir = tmp_path / "logs"
    _slowed_logs(log_dir, stall=(FAULT_AT, healed))
    exp_dir = _journal(tmp_path / "run", log_dir)
    journal = load_journal(exp_dir / "journal.json")
    journal.method[0].output = {
        "fault_id": "exp-1.cut",
        "kind": "partition",
        "node": "node1",
        "applied_at": FAULT_AT,
    }
    journal.faults = [
        LedgerEntry(
            id="exp-1.cut",
            experiment_id="exp-1",
            kind="partition",
            spec=REGISTRY["partition"].experiment(kind="partition", nodes=["node1"]),
            target=FaultTarget(job="experiment", node="node1"),
            state="reverted",
            recorded_at=FAULT_AT - 1,
            expires_at=FAULT_AT + 60,
            injected_at=FAULT_AT,
            reverted_at=healed,
            controller_pid=1,
            controller_started_at=T0,
        )
    ]
    write_journal(journal, exp_dir / "journal.json")

    pm = postmortem_from_files(exp_dir, evidence=_evidence(), baseline_log_dir=None)

    assert pm.workers_restarted_at is None and pm.steps_lost is None
    assert pm.recovered and pm.recovered_by == "fault removed"
    assert pm.time_to_recover_seconds == pytest.approx(healed + 0.2 - FAULT_AT)  # rank 3 last
    md = _markdown(pm)
    assert "time to recover (fault → every rank stepping after the fault's removal)" in md

    # The agent reverted it at its TTL; the rollback closed the ledger row after the job ended.
    late = journal.faults[0].model_copy(update={"expires_at": healed, "reverted_at": T0 + 500})
    journal.faults = [late]
    write_journal(journal, exp_dir / "journal.json")
    at_ttl = postmortem_from_files(exp_dir, evidence=_evidence(), baseline_log_dir=None)
    assert at_ttl.time_to_recover_seconds == pytest.approx(healed + 0.2 - FAULT_AT)

    journal.faults = [
        journal.faults[0].model_copy(update={"state": "injected", "reverted_at": None})
    ]
    write_journal(journal, exp_dir / "journal.json")
    still_open = postmortem_from_files(exp_dir, evidence=_evidence(), baseline_log_dir=None)
    assert not still_open.recovered and still_open.time_to_recover_seconds is None


@pytest.mark.parametrize("text", ["{}", '{"experiment_id": 3}'])
def test_postmortem_of_a_journal_that_is_not_one_is_a_one_line_error(
    tmp_path: Path, text: str
) -> None:
    """No pydantic dump (several lines, documentation URLs): one line naming the fields."""
    experiment_dir = tmp_path / "run" / "experiments" / "exp"
    experiment_dir.mkdir(parents=True)
    (experiment_dir / "journal.json").write_text(text)
    cli = subprocess.run(
        [str(STORMWATCH), "chaos", "postmortem", str(experiment_dir), "--offline"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert cli.returncode == 1, cli.stderr
    assert "Traceback" not in cli.stderr and "errors.pydantic.dev" not in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    assert "not a journal written by `stormwatch chaos run`" in cli.stderr
    assert "title: Field required" in cli.stderr
    assert not (experiment_dir / "postmortem.md").exists()


def test_the_processes_a_kill_torchrun_left_behind_are_listed_with_what_removed_them(
    tmp_path: Path,
) -> None:
    """The revert's answer as the agent gives it (``details["revert"]``), turned into the
    ledger's revert detail by the chaos side, lands in the post-mortem's Faults section."""
    from stormwatch.contracts.fault_ledger import FaultTarget, LedgerEntry
    from stormwatch.contracts.journal import load_journal
    from stormwatch.faults import REGISTRY
    from stormwatch.faults.kinds.orphans import describe_orphans

    log_dir = tmp_path / "logs"
    _slowed_logs(log_dir, stall=(FAULT_AT, FAULT_AT + 20.0))
    exp_dir = _journal(tmp_path / "run", log_dir)
    journal = load_journal(exp_dir / "journal.json")
    orphans = [
        {"job": "experiment", "rank": 2, "pid": 4343, "removed_by": "the revert: SIGTERM"},
        {"job": "experiment", "rank": 3, "pid": 4344, "removed_by": "exited before the revert"},
    ]
    detail = "node1: reverted (" + describe_orphans({"revert": {"orphans": orphans}}) + ")"
    journal.faults = [
        LedgerEntry(
            id="exp-1.kill-tr",
            experiment_id="exp-1",
            kind="kill_torchrun",
            spec=REGISTRY["kill_torchrun"].experiment(kind="kill_torchrun", node="node1"),
            target=FaultTarget(job="experiment", node="node1"),
            state="reverted",
            recorded_at=FAULT_AT - 1,
            expires_at=FAULT_AT + 60,
            injected_at=FAULT_AT,
            reverted_at=FAULT_AT + 30,
            revert_detail=detail,
            controller_pid=1,
            controller_started_at=T0,
        )
    ]
    write_journal(journal, exp_dir / "journal.json")

    pm = postmortem_from_files(exp_dir, evidence=_evidence(), baseline_log_dir=None)

    [line] = pm.processes_reaped
    assert "rank 2 of job experiment (pid 4343): the revert: SIGTERM" in line
    assert "rank 3 of job experiment (pid 4344): exited before the revert" in line
    md = _markdown(pm)
    assert "Processes the faults left behind, and what removed them:" in md
    assert "exp-1.kill-tr (kill_torchrun)" in md


def test_a_restart_that_failed_on_a_taken_port_is_its_own_cause_in_the_experiment_report(
    recorded: tuple[Path, Path, Path],
) -> None:
    """Issue 17 item 6: the experiment post-mortem, like the incident's, reads the job's dumps
    of every attempt and reports a restart that failed with EADDRINUSE as its own cause."""
    exp_dir, logs, _ = recorded
    dumps = logs / "dumps"
    dumps.mkdir()
    before = DumpRecord(rank=3, attempt=0, pid=10, time=FAULT_AT - 5.0, errno=errno.EADDRINUSE)
    failed = DumpRecord(
        rank=0, attempt=1, pid=11, time=RESTART_AT - 1.0, errno=errno.EADDRINUSE,
        phase="rendezvous", reason="DistNetworkError: The server socket has failed to listen",
    )  # fmt: skip
    other = DumpRecord(rank=1, attempt=1, pid=12, time=RESTART_AT, errno=errno.ECONNREFUSED)
    for record in (before, failed, other):
        path = dump_path(dumps, record.rank, attempt=record.attempt, pid=record.pid)
        path.write_text(record.model_dump_json())
    pm = postmortem_from_files(exp_dir, evidence=_evidence(), baseline_log_dir=None)
    assert pm.restart_failure is not None, pm
    assert pm.restart_failure.cause == "port conflict on restart"
    assert pm.restart_failure.ranks == [0]  # not the dump from before the fault
    md = _markdown(pm)
    assert "| restart failure | port conflict on restart |" in md
    assert "## Restart failed: port conflict on restart" in md and "rendezvous" in md

    (dumps / failed_name(failed)).unlink()
    later = DumpRecord(rank=2, attempt=5, pid=13, time=FAULT_AT + 10_000, errno=errno.EADDRINUSE)
    (dumps / failed_name(later)).write_text(later.model_dump_json())  # a later run's
    (dumps / "rank9.json").write_bytes(b'{"rank": 9, "reason": "\xff"}')  # not UTF-8: skipped
    assert (
        postmortem_from_files(exp_dir, evidence=_evidence(), baseline_log_dir=None).restart_failure
        is None
    )


def failed_name(record: DumpRecord) -> str:
    return dump_path(Path("."), record.rank, attempt=record.attempt, pid=record.pid).name
