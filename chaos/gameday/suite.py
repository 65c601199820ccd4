"""Game days: run a folder of experiments one after another and score them.

``stormwatch chaos suite DIR`` (see docs/chaos-suite.md):

1. every ``*.yaml``/``*.yml`` in DIR is validated first; one invalid file and
   nothing starts (exit 2, every problem of every file listed);
2. the lab in ``--run-dir`` must be up;
3. one fault-free baseline job per seed (the most steps any experiment of that
   seed trains, no step delay) is trained for the loss check;
4. each experiment runs like ``stormwatch chaos run`` (journal, rollbacks,
   post-mortem), then :func:`stormwatch.chaos.reports.verify.verify` checks that nothing was
   lost; its row goes into the scorecard, rewritten after every experiment;
5. SIGINT/SIGTERM: the running experiment rolls back (the runner's own handling),
   the rest are ``not run``, the scorecard is written, exit 130.

The scorecard (:mod:`stormwatch.chaos.gameday.scorecard`) is in
``<run-dir>/suites/<suite-id>/``.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from stormwatch.chaos.console import ConsoleReporter
from stormwatch.chaos.errors import ChaosError, InvalidExperiment
from stormwatch.chaos.execution.ids import slug
from stormwatch.chaos.execution.runner import EXIT_ABORTED, Runner, run_experiment
from stormwatch.chaos.experiment.loader import load_experiment
from stormwatch.chaos.experiment.model import Experiment
from stormwatch.chaos.gameday.baseline import train_baseline
from stormwatch.chaos.gameday.detection import Detection, judge_detection
from stormwatch.chaos.gameday.scorecard import (
    Scorecard,
    ScorecardRow,
    write_scorecard,
)
from stormwatch.chaos.reports.evidence import AlertEvidence, RankPlacement, load_evidence
from stormwatch.chaos.reports.experiment_report import MATCH_SLACK_SECONDS
from stormwatch.chaos.reports.report import generate_postmortem
from stormwatch.chaos.reports.verify import Verification, write_verification
from stormwatch.chaos.target import Target
from stormwatch.contracts.journal import Journal
from stormwatch.errors import ConfigError
from stormwatch.faults import category_of as default_category
from stormwatch.postmortem import ExperimentPostMortem
from stormwatch.telemetry.ranklogs import RankLog, read_job_logs

#: Extra seconds a baseline may take per step beyond its start-up (a loaded 2-core lab).


@dataclass(frozen=True)
class SuiteEntry:
    """One validated experiment of a suite."""

    path: Path
    experiment: Experiment


@dataclass(frozen=True, kw_only=True)
class SuiteOptions:
    """How to run a suite.

    Attributes:
        baseline: train fault-free baselines for the loss check (off: loss not compared).
        wait_detected_seconds: how long each post-mortem waits for an alert to fire.
        strict_targets: the detection targets (within the class's target, culprit
            correct, no false alarm) count toward every experiment's verdict, as
            ``expect.strict_targets`` does for one; off by default while the alert rules
            are being made faster (issue 18).
    """

    baseline: bool = True
    wait_detected_seconds: float = 60.0
    strict_targets: bool = False


def suite_files(folder: Path) -> list[Path]:
    """The experiment files of ``folder`` (``*.yaml``, ``*.yml``), sorted by name.

    Raises:
        ConfigError: not a folder, or no experiment file in it.
    """
    if not folder.is_dir():
        raise ConfigError(f"suite {folder}: not a folder; give a folder of experiment YAML files")
    files = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise ConfigError(f"suite {folder}: no *.yaml experiment files in it")
    return files


def load_suite(folder: Path) -> list[SuiteEntry]:
    """Validate every experiment of ``folder``.

    Raises:
        ConfigError: see :func:`suite_files`; or one or more files are invalid (every
            problem of every file is listed, each naming file, line and field).
    """
    entries: list[SuiteEntry] = []
    problems: list[InvalidExperiment] = []
    for path in suite_files(folder):
        try:
            entries.append(SuiteEntry(path, load_experiment(path)))
        except InvalidExperiment as exc:
            problems.append(exc)
    if problems:
        raise ConfigError(
            f"suite {folder}: {len(problems)} of {len(problems) + len(entries)} experiment(s) "
            "invalid; nothing was started\n" + "\n".join(str(p) for p in problems)
        )
    return entries


def new_suite_id(folder: Path, now: float | None = None) -> str:
    """``20250101T120000-suite-1a2b``: sortable by start time (``latest_scorecard`` relies on it)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{slug(folder.resolve().name, 30, 'suite')}-{secrets.token_hex(2)}"


def category_of(experiment: Experiment, kind: str | None) -> str | None:
    """``expect.category``, else the default of the fault kind (None: not a job interruption)."""
    if experiment.expect.category is not None:
        return experiment.expect.category
    return default_category(kind)


def _expected_alert(
    experiment: Experiment, pm: ExperimentPostMortem, alerts: list[AlertEvidence]
) -> AlertEvidence | None:
    """The first alert of ``expect.alerts`` firing after the fault (None when none did)."""
    if pm.fault_at is None:
        return None
    after = [
        a
        for a in alerts
        if a.alertname in experiment.expect.alerts
        and a.firing_at >= pm.fault_at - MATCH_SLACK_SECONDS
    ]
    return min(after, key=lambda a: a.firing_at) if after else None


def detecting_alert(
    experiment: Experiment, pm: ExperimentPostMortem, alerts: list[AlertEvidence]
) -> tuple[Detection, list[str]]:
    """Which alert detected the fault, and the reasons it gives to fail the row: one of
    ``expect.alerts`` (the first after the fault, or the post-mortem's when it is one and
    fired first) when the file lists some, else the post-mortem's alert about the job."""
    expect = experiment.expect
    found = Detection(
        detected=pm.detected,
        alert=pm.alertname,
        time_to_detect=pm.time_to_detect_seconds,
        labels=dict(pm.alert_labels),
        firing_at=pm.alert_firing_at,
    )
    reasons: list[str] = []
    if expect.alerts:
        hit = _expected_alert(experiment, pm, alerts)
        hit_ttd = (
            max(0.0, hit.firing_at - pm.fault_at)
            if hit is not None and pm.fault_at is not None
            else None
        )
        ttd = found.time_to_detect
        own = pm.detected and pm.alertname in expect.alerts and ttd is not None
        if hit is not None and hit_ttd is not None and (not own or hit_ttd < (ttd or 0.0)):
            found = Detection(
                detected=True,
                alert=hit.alertname,
                time_to_detect=hit_ttd,
                labels=dict(hit.labels),
                firing_at=hit.firing_at,
            )
        elif not own:
            if expect.detect:
                seen = f" (only {pm.alertname} fired)" if pm.alertname else ""
                reasons.append(f"none of {', '.join(expect.alerts)} fired after the fault{seen}")
            found = replace(found, detected=False) if expect.detect else found
    if expect.detect and not found.detected and not expect.alerts:
        reasons.append("not detected: no alert about the job fired after the fault")
    if not found.detected:
        found = replace(found, alert=None, time_to_detect=None, labels={})
    return found, reasons


def score(
    entry: SuiteEntry,
    journal: Journal,
    pm: ExperimentPostMortem,
    verification: Verification,
    alerts: list[AlertEvidence],
    experiment_dir: Path,
    *,
    logs: Mapping[int, RankLog] | None = None,
    placements: Sequence[RankPlacement] = (),
    strict_targets: bool = False,
) -> ScorecardRow:
    """The scorecard row of one finished experiment (verdict rules in :mod:`.scorecard`).

    ``alerts``: every alert of the evidence; ``logs``: the job's rank logs (its step times
    and failed saves, for the targets); ``placements``: which node ran which rank;
    ``strict_targets``: the detection targets count toward the verdict (as the
    experiment's ``expect.strict_targets`` does).
    """
    detection, reasons = detecting_alert(entry.experiment, pm, alerts)
    if journal.status != "completed":
        reasons.append(
            f"experiment {journal.status}" + (f": {journal.error}" if journal.error else "")
        )
    elif not journal.hypothesis_held:
        reasons.append("the steady-state hypothesis did not hold")
    if journal.rollbacks_ok is not True:
        reasons.append("a rollback or fault revert failed")
    reasons += verification.failures()
    enforced = strict_targets or entry.experiment.expect.strict_targets
    targets = judge_detection(
        entry.experiment,
        journal,
        pm,
        detection,
        alerts=alerts,
        logs=logs or {},
        placements=placements,
    )
    if enforced:
        reasons += targets.problems
    where = f" rank {pm.fault_rank}" if pm.fault_rank is not None else ""
    where += f" ({pm.fault_node})" if pm.fault_node else ""
    return ScorecardRow(
        file=str(entry.path),
        title=entry.experiment.title,
        experiment_id=journal.experiment_id,
        fault=f"{pm.fault_kind}{where}" if pm.fault_kind else "",
        fault_kind=pm.fault_kind,
        category=category_of(entry.experiment, pm.fault_kind),
        status=journal.status,
        detected=detection.detected if pm.fault_at is not None else None,
        alert=detection.alert,
        time_to_detect_seconds=detection.time_to_detect,
        **targets.row_fields(),
        targets_enforced=enforced,
        recovered=pm.recovered,
        recovered_by=pm.recovered_by,
        time_to_recover_seconds=pm.time_to_recover_seconds,
        steps_lost=pm.steps_lost,
        loss=verification.loss.ok,
        checkpoint=verification.checkpoint.ok,
        faults_cleared=verification.faults_cleared.ok,
        verdict="fail" if reasons else "pass",
        reasons=reasons,
        experiment_dir=str(experiment_dir),
    )


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _arm_interrupts() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt (again after each experiment: the runner's
    event loop resets them to the defaults when it removes its own handlers)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_interrupt)


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the block (a suite, a soak); the previous
    handlers are restored after."""
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    _arm_interrupts()
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


class SuiteRunner:
    """Runs validated experiments against the lab's :class:`Target`, writing the scorecard.

    Args:
        entries: from :func:`load_suite`.
        folder: the suite folder (named in the scorecard).
        target: the lab (:func:`stormwatch.chaos.target.lab_target`).
        options: see :class:`SuiteOptions`.
        reporter: progress output.
        on_row: called with each finished row (the CLI prints it).
    """

    def __init__(
        self,
        entries: list[SuiteEntry],
        *,
        folder: Path,
        target: Target,
        options: SuiteOptions | None = None,
        reporter: ConsoleReporter | None = None,
        on_row: Callable[[ScorecardRow, int, int], None] | None = None,
    ) -> None:
        self.entries = entries
        self.target = target
        self.options = options or SuiteOptions()
        self.reporter = reporter or ConsoleReporter()
        self.on_row = on_row
        self.suite_id = new_suite_id(folder)
        self.folder = Path(target.run_dir) / "suites" / self.suite_id
        self.card = Scorecard(
            suite_id=self.suite_id,
            suite_dir=str(folder),
            run_dir=str(target.run_dir),
            started_at=time.time(),
            strict_targets=self.options.strict_targets,
            rows=[ScorecardRow(file=str(e.path), title=e.experiment.title) for e in entries],
        )

    def save(self) -> tuple[Path, Path]:
        """Write the scorecard as it stands; returns (md, json)."""
        return write_scorecard(self.card, self.folder)

    def run(self) -> Scorecard:
        """Run every experiment; returns the scorecard (also written to :attr:`folder`)."""
        self.save()
        try:
            with interrupts_raise():
                if self.options.baseline:
                    self._baselines()
                for index, entry in enumerate(self.entries):
                    self.reporter.event(
                        f"[{index + 1}/{len(self.entries)}] {entry.path.name}: "
                        f"{entry.experiment.title}"
                    )
                    aborted = self._one(index, entry)
                    if aborted:
                        self.card.interrupted = True
                        break
        except KeyboardInterrupt:
            self.card.interrupted = True
            self.reporter.event("interrupted: the remaining experiments are not run")
        self.card.ended_at = time.time()
        self.save()
        return self.card

    def _one(self, index: int, entry: SuiteEntry) -> bool:
        """Run one experiment and score it; True when it was aborted (stop the suite)."""
        runner = Runner(
            entry.experiment, source=entry.path, target=self.target, reporter=self.reporter
        )
        result = run_experiment(runner)
        _arm_interrupts()
        self.reporter.stop()
        journal = result.journal
        baseline_job = self.card.baselines.get(str(entry.experiment.job.seed))
        baseline_dir = self.target.jobs.log_dir(baseline_job) if baseline_job else None
        if journal.job is None:
            row = ScorecardRow(
                file=str(entry.path),
                title=entry.experiment.title,
                experiment_id=journal.experiment_id,
                status=journal.status,
                verdict="fail",
                reasons=[f"the job did not start: {journal.error}"],
                experiment_dir=str(runner.experiment_dir),
            )
        else:
            row = self._score(entry, runner, journal, baseline_dir, result.exit_code)
        self.card.rows[index] = row
        self.save()
        if self.on_row is not None:
            self.on_row(row, index, len(self.entries))
        return result.exit_code == EXIT_ABORTED

    def _score(
        self,
        entry: SuiteEntry,
        runner: Runner,
        journal: Journal,
        baseline_dir: Path | None,
        exit_code: int,
    ) -> ScorecardRow:
        # No wait when interrupted, or when no alert is expected (one look at what fired).
        expected = entry.experiment.expect.detect and exit_code != EXIT_ABORTED
        wait = self.options.wait_detected_seconds if expected else 0.0
        pm, _ = asyncio.run(
            generate_postmortem(
                runner.experiment_dir,
                target=self.target,
                baseline_log_dir=baseline_dir,
                wait_resolved_seconds=wait,
                reporter=self.reporter,
                wait_until="detected",
            )
        )
        self.reporter.stop()
        expect = entry.experiment.expect
        verification = write_verification(
            runner.experiment_dir,
            journal,
            pm,
            target=self.target,
            baseline_log_dir=baseline_dir,
            loss_mode=expect.loss,
            loss_rel_tolerance=expect.loss_rel_tolerance,
        )
        evidence_path = runner.experiment_dir / "evidence.json"
        evidence = load_evidence(evidence_path) if evidence_path.exists() else None
        return score(
            entry,
            journal,
            pm,
            verification,
            evidence.alerts if evidence is not None else [],
            runner.experiment_dir,
            logs=read_job_logs(journal.job.log_dir) if journal.job is not None else {},
            placements=evidence.ranks if evidence is not None else (),
            strict_targets=self.options.strict_targets,
        )

    # -- baselines ---------------------------------------------------------------------------

    def _baselines(self) -> None:
        """Train one fault-free baseline per seed (the most steps of that seed's experiments)."""
        wanted: dict[int, Experiment] = {}
        for entry in self.entries:
            if entry.experiment.expect.loss == "skip":
                continue
            job = entry.experiment.job
            best = wanted.get(job.seed)
            if best is None or job.steps > best.job.steps:
                wanted[job.seed] = entry.experiment
        suffix = self.suite_id.rsplit("-", 1)[-1]
        for seed, experiment in sorted(wanted.items()):
            name = f"suite-baseline-{self.suite_id[:15].lower()}-{suffix}-s{seed}"
            try:
                job = experiment.job
                self.reporter.event(
                    f"baseline {name}: {job.steps} steps, seed {job.seed}, no faults"
                )
                train_baseline(self.target.jobs, name, job, self.reporter, step_delay=0.0)
                self.reporter.stop()
            except ChaosError as exc:
                self.reporter.event(f"baseline for seed {seed} failed: {exc}; loss not compared")
                continue
            self.card.baselines[str(seed)] = name
            self.save()


__all__ = [
    "SuiteEntry",
    "SuiteOptions",
    "SuiteRunner",
    "category_of",
    "detecting_alert",
    "interrupts_raise",
    "load_suite",
    "new_suite_id",
    "score",
    "suite_files",
]
