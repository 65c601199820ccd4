"""Generate a post-mortem for a finished run: collect evidence, analyse, plot, write the files.

Used by ``stormwatch chaos run``, ``stormwatch chaos postmortem``, game days and the demo.
The analysis is :mod:`.experiment_report`; the figure and the files are the engine's
(:mod:`stormwatch.postmortem`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.execution.runner import NullReporter, Reporter
from stormwatch.chaos.reports.evidence import (
    Evidence,
    collect_evidence,
    load_evidence,
    save_evidence,
    wait_for_evidence,
)
from stormwatch.chaos.reports.experiment_report import analyze, write_postmortem
from stormwatch.chaos.target import Target
from stormwatch.contracts.journal import Journal, load_journal
from stormwatch.postmortem import ExperimentPostMortem
from stormwatch.postmortem.plots import plot_loss
from stormwatch.telemetry.culprit import reduce_dump
from stormwatch.telemetry.dump import read_all_dumps
from stormwatch.telemetry.events import log_path
from stormwatch.telemetry.ranklogs import (
    RankLog,
    rank_progress,
    read_job_logs,
    read_rank_log,
)

#: How far before the experiment's start the alert query looks (s): an alert that was
#: already firing then is not the experiment's.
LOOKBACK_SECONDS = 60.0


#: Seconds after the experiment's end a dump still counts as its own (a rank stopped by the
#: rollback may dump while the journal is being closed).
DUMP_SLACK_S = 30.0


def read_journal(experiment_dir: Path) -> Journal:
    """The journal of ``experiment_dir``.

    Raises:
        ChaosError: missing or unreadable.
    """
    path = Path(experiment_dir) / "journal.json"
    try:
        return load_journal(path)
    except ValidationError as exc:  # one line, not pydantic's multi-line dump with URLs
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'file'}: {err['msg']}"
            for err in exc.errors(include_url=False)[:5]
        )
        raise ChaosError(
            f"{path}: not a journal written by `stormwatch chaos run` ({problems})"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ChaosError(f"{path}: cannot read the journal: {exc}") from exc


def postmortem_from_files(
    experiment_dir: Path, *, evidence: Evidence | None, baseline_log_dir: Path | None
) -> ExperimentPostMortem:
    """Analyse the journal, the job's rank logs, the baseline's rank-0 log and ``evidence``."""
    journal = read_journal(experiment_dir)
    logs = read_job_logs(journal.job.log_dir) if journal.job is not None else {}
    baseline: RankLog | None = None
    name = None
    if baseline_log_dir is not None:
        path = log_path(Path(baseline_log_dir), 0)
        name = Path(baseline_log_dir).parent.name
        baseline = read_rank_log(path, 0) if path.exists() else None
    dumps = []
    if journal.job is not None:  # the dumps of this run only, not of a later experiment's
        until = journal.ended_at + DUMP_SLACK_S if journal.ended_at is not None else None
        found = read_all_dumps(Path(journal.job.log_dir) / "dumps", journal.started_at, until)
        dumps = [reduce_dump(d) for d in found]
    pm = analyze(
        journal, logs, evidence=evidence, baseline=baseline, baseline_name=name, dumps=dumps
    )
    if baseline_log_dir is not None and baseline is None:
        pm.notes.append(f"baseline log {log_path(Path(baseline_log_dir), 0)} is missing")
    return pm


async def generate_postmortem(
    experiment_dir: Path,
    *,
    target: Target | None,
    baseline_log_dir: Path | None,
    wait_resolved_seconds: float = 0.0,
    reporter: Reporter | None = None,
    wait_until: Literal["resolved", "detected"] = "resolved",
) -> tuple[ExperimentPostMortem, Path]:
    """Collect evidence from ``target`` (or reuse ``evidence.json`` when ``target`` is None),
    optionally waiting up to ``wait_resolved_seconds`` for the alert to be received and resolved
    (``wait_until="detected"``: only until it fired), then write ``postmortem.md``/``.json``.
    Returns the post-mortem and the Markdown path.
    """
    reporter = reporter or NullReporter()
    experiment_dir = Path(experiment_dir)
    journal = read_journal(experiment_dir)
    evidence_path = experiment_dir / "evidence.json"
    evidence: Evidence | None
    if target is None:
        evidence = load_evidence(evidence_path) if evidence_path.exists() else None
    else:
        start = journal.started_at - LOOKBACK_SECONDS

        async def collect() -> Evidence:
            return await collect_evidence(
                window_start=start,
                prometheus_url=target.prometheus_url,
                prometheus_http=target.prometheus_http,
                responder_url=target.responder_url,
                responder_token_file=target.responder_token_file,
            )

        def settled(ev: Evidence) -> bool:
            pm = postmortem_from_files(experiment_dir, evidence=ev, baseline_log_dir=None)
            if wait_until == "detected":
                return pm.fault_at is None or pm.detected
            return pm.fault_at is None or (
                pm.alert_resolved_at is not None and pm.alert_received_at is not None
            )

        def progress(ev: Evidence, elapsed: float) -> None:
            pm = postmortem_from_files(experiment_dir, evidence=ev, baseline_log_dir=None)
            what = (
                "waiting for the alert to fire"
                if not pm.detected
                else "waiting for the responder"
                if pm.alert_received_at is None
                else "waiting for the alert to resolve"
            )
            reporter.status(f"{what} ({elapsed:.0f}/{wait_resolved_seconds:.0f} s)")

        evidence = await wait_for_evidence(
            collect, until=settled, timeout=wait_resolved_seconds, on_poll=progress
        )
        save_evidence(evidence, evidence_path)
    pm = postmortem_from_files(experiment_dir, evidence=evidence, baseline_log_dir=baseline_log_dir)
    _plot(pm, journal, experiment_dir, baseline_log_dir)
    md, _ = write_postmortem(pm, experiment_dir)
    return pm, md


def _plot(
    pm: ExperimentPostMortem, journal: Journal, experiment_dir: Path, baseline: Path | None
) -> None:
    """Draw ``loss.png`` beside the report; a plotting failure is a note, never fatal."""
    if journal.job is None:
        return
    rank0 = read_rank_log(log_path(Path(journal.job.log_dir), 0), 0)
    if not rank0.steps:
        return
    base_path = log_path(Path(baseline), 0) if baseline is not None else None
    base = read_rank_log(base_path, 0) if base_path is not None and base_path.exists() else None
    try:
        plot_loss(
            rank_progress(rank0),
            rank_progress(base) if base is not None else None,
            experiment_dir / "loss.png",
            fault_step=pm.last_step_before_fault,
            resumed_from_step=pm.resumed_from_step,
            title=pm.title,
        )
    except Exception as exc:  # matplotlib failing must not lose the report
        pm.notes.append(f"loss plot not drawn: {exc}")
        return
    pm.loss_plot = "loss.png"


__all__ = ["generate_postmortem", "postmortem_from_files", "read_journal"]
