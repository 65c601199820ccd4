"""The runner's collaborators, each in isolation: stand-in senders, reverters and jobs, real
journal and ledger files, no processes and no network."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest

from stormwatch.chaos import Ledger, ledger_path, parse_experiment
from stormwatch.chaos.errors import ActivityFailed, ChaosError
from stormwatch.chaos.execution.checks import HypothesisChecker, ProbeChecker, job_variables
from stormwatch.chaos.execution.context import RunAnnotations, RunContext
from stormwatch.chaos.execution.ids import job_name_for
from stormwatch.chaos.execution.injection.injector import Injected
from stormwatch.chaos.execution.injection.placement import InjectionResult
from stormwatch.chaos.execution.injection.tracker import FaultTracker
from stormwatch.chaos.execution.journal_writer import JournalWriter
from stormwatch.chaos.execution.lifecycle import JobLifecycle
from stormwatch.chaos.execution.method import MethodExecutor, job_shape
from stormwatch.chaos.execution.probes import ProbeContext
from stormwatch.chaos.execution.rollback import RollbackExecutor, rollbacks_run
from stormwatch.chaos.execution.safeguards import SafeguardWatcher
from stormwatch.chaos.experiment.model import (
    Experiment,
    JobSection,
    RollbackStrategy,
    When,
)
from stormwatch.chaos.experiment.selection import Shape
from stormwatch.chaos.ledger.revert import RevertOutcome
from stormwatch.chaos.node_service import NodeReturn
from stormwatch.chaos.target import AttachedJobs, Target
from stormwatch.contracts.fault_ledger import FaultTarget, LedgerEntry
from stormwatch.contracts.journal import (
    ExperimentStatus,
    JobRef,
    Journal,
    load_journal,
)
from stormwatch.dashboards.annotations import Annotator
from stormwatch.faults import REGISTRY, ExperimentFault
from stormwatch.platforms import AgentEndpoint

FreezeRankFault = REGISTRY["freeze_rank"].experiment
ID = "20250101T000000-unit-0000"
#: An HTTP probe without a session fails at once and for good: a failing check without a wait.
FAILS = '{type: http, url: "http://127.0.0.1:9/"}'
PROGRESSING = "{type: job, expect: progressing, window_seconds: 30}"


def _yaml(
    method: str,
    *,
    rollbacks: str = "",
    strategy: str = "always",
    extra: str = "",
    probe: str = PROGRESSING,
) -> Experiment:
    return parse_experiment(f"""
version: 1
title: unit
job: {{name: unit, steps: 100, checkpoint_every: 10}}
steady_state_hypothesis:
  title: the rank steps
  probes:
    - {{name: rank-steps, provider: {probe}}}
method:
{method}
rollbacks:
{rollbacks or "  []"}
rollback_strategy: {strategy}
{extra}
""")


FREEZE = "  - {type: action, name: freeze, fault: {kind: freeze_rank, rank: 0, ttl_seconds: 60}}"
KILL = "  - {type: action, name: kill, fault: {kind: kill_rank, rank: 0}}"


class Said:
    """A reporter that keeps what it was told."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.statuses: list[str] = []

    def status(self, text: str) -> None:
        self.statuses.append(text)

    def event(self, text: str) -> None:
        self.events.append(text)


class KeptAnnotations(Annotator):
    """An annotator (off) that keeps each annotation's text and tags."""

    def __init__(self) -> None:
        super().__init__(None)
        self.kept: list[tuple[str, tuple[str, ...]]] = []

    def annotate(
        self,
        text: str,
        tags: Iterable[str],
        *,
        start: float | None = None,
        end: float | None = None,
    ) -> None:
        self.kept.append((text, tuple(tags)))


class Run:
    """One run's context, its ledger and tracker, and a stand-in job with rank logs."""

    def __init__(self, tmp_path: Path, experiment: Experiment) -> None:
        self.run_dir = tmp_path / "run"
        self.said = Said()
        self.annotator = KeptAnnotations()
        journal = Journal(
            experiment_id=ID, title="unit", file=Path("unit.yaml"), experiment={}, started_at=0.0
        )
        self.path = self.run_dir / "experiments" / ID / "journal.json"
        self.path.parent.mkdir(parents=True)
        self.ctx = RunContext(
            experiment=experiment,
            experiment_id=ID,
            writer=JournalWriter(journal, self.path),
            reporter=self.said,
            annotations=RunAnnotations(self.annotator, ID),
        )
        self.ledger = Ledger(ledger_path(self.run_dir))
        self.faults = FaultTracker(self.ledger, ID)
        self.jobs = AttachedJobs(self.run_dir, world_size=1)
        self.job = JobRef(
            name="unit",
            log_dir=self.jobs.log_dir("unit"),
            world_size=1,
            started_by_runner=False,
        )

    @property
    def journal(self) -> Journal:
        return self.ctx.journal

    def step(self, step: int, at: float | None = None) -> None:
        """Rank 0 logs a completed ``step`` (now, or at Unix time ``at``)."""
        self.job.log_dir.mkdir(parents=True, exist_ok=True)
        line = {"event": "step", "time": time.time() if at is None else at, "rank": 0, "step": step}
        with (self.job.log_dir / "rank0.jsonl").open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    def probes(self) -> ProbeChecker:
        base = ProbeContext(
            job=self.job,
            jobs=self.jobs,
            prometheus=None,
            variables=job_variables(self.ctx.experiment.job, self.job),
        )
        return ProbeChecker(self.ctx, base=base, faults=self.faults)

    def method(self, sender: StandInSender, shape: Shape | None = None) -> MethodExecutor:
        return MethodExecutor(
            self.ctx,
            shape=shape or Shape(("node0",), 1),
            sender=sender,
            probes=self.probes(),
            faults=self.faults,
        )

    def rollback(
        self, reverter: StandInReverter | None = None, nodes: StandInNodes | None = None
    ) -> RollbackExecutor:
        reverter = reverter or StandInReverter(self.ledger)
        return RollbackExecutor(self.ctx, faults=self.faults, reverter=reverter, nodes=nodes)


class StandInSender:
    """Injects nothing: writes the ledger row (pending, then injected) as the injector does."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.waited: list[tuple[int, int]] = []

    async def wait_for_step(self, when: When, rank: int) -> tuple[int, int]:
        self.waited.append((when.step, rank))
        return when.step, 0

    async def inject(
        self, name: str, fault: ExperimentFault, *, recorded: Callable[[], None]
    ) -> Injected:
        fault_id = f"{ID}.{name}"
        now = time.time()
        self.ledger.record(
            fault_id=fault_id,
            experiment_id=ID,
            spec=fault,
            target=FaultTarget(job="unit", rank=0, node="node0"),
            expires_at=now + fault.ttl_seconds,
        )
        recorded()
        result = InjectionResult(applied_at=now, expires_at=now + fault.ttl_seconds, detail="sent")
        entry = self.ledger.mark_injected(
            fault_id, injected_at=now, expires_at=result.expires_at, target_pid=None
        )
        return Injected(entry, result)


class StandInReverter:
    """Closes ledger rows as a revert does; refuses the fault ids in ``refuse``."""

    def __init__(self, ledger: Ledger, refuse: Iterable[str] = ()) -> None:
        self.ledger = ledger
        self.refuse = set(refuse)
        self.reasons: list[str] = []

    async def revert_open(self, *, reason: str, experiment_id: str | None) -> list[RevertOutcome]:
        entries = self.ledger.open_faults(experiment_id=experiment_id)
        return await self.revert_entries(entries, reason=reason)

    async def revert_entries(
        self, entries: list[LedgerEntry], *, reason: str
    ) -> list[RevertOutcome]:
        self.reasons.append(reason)
        outcomes = []
        for entry in entries:
            if entry.id in self.refuse:
                self.ledger.note_error(entry.id, "refused")
                outcomes.append(RevertOutcome(entry.id, False, "refused"))
            else:
                self.ledger.mark_reverted(entry.id, reason=reason, detail="undone")
                outcomes.append(RevertOutcome(entry.id, True, "undone"))
        return outcomes


class StandInNodes:
    """A platform's node service: answers ``action`` for every node, keeps each call."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.calls: list[tuple[list[str], float]] = []

    def return_to_service(self, nodes: Sequence[str], *, since: float) -> list[NodeReturn]:
        self.calls.append((list(nodes), since))
        return [NodeReturn(node=n, action=self.action, before="DOWN", detail="seen") for n in nodes]


# -- the rollback executor ------------------------------------------------------------------


@pytest.mark.parametrize(("action", "ok"), [("resumed", True), ("failed", False)])
def test_after_a_revert_the_platform_returns_the_faults_nodes_to_service_journaled(
    tmp_path: Path, action: str, ok: bool
) -> None:
    run = Run(tmp_path, _yaml(FREEZE, rollbacks="  - {type: revert, name: undo}"))
    asyncio.run(run.method(StandInSender(run.ledger)).run())
    [entry] = run.faults.open_faults()
    nodes = StandInNodes(action)

    assert asyncio.run(run.rollback(nodes=nodes).rollbacks("completed", None)) is ok
    assert asyncio.run(run.rollback(nodes=nodes).cleanup("completed")) is True  # nothing open

    assert nodes.calls == [(["node0"], entry.injected_at)]
    undo, returned = run.journal.rollbacks
    assert (undo.name, undo.status) == ("undo", "succeeded")
    assert (returned.name, returned.type) == ("return-nodes-to-service", "resume")
    assert returned.status == ("succeeded" if ok else "failed")
    assert returned.output == [
        {"node": "node0", "action": action, "before": "DOWN", "detail": "seen"}
    ]
    assert any(f"node0 {action}: seen" in line for line in run.said.events)


def test_a_fault_its_ttl_reaper_closed_before_the_rollback_still_gets_its_nodes_returned(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, _yaml(FREEZE, rollbacks="  - {type: revert, name: undo}"))
    asyncio.run(run.method(StandInSender(run.ledger)).run())
    [entry] = run.faults.open_faults()
    run.ledger.mark_reverted(entry.id, reason="ttl", detail="by its reaper")
    nodes = StandInNodes("resumed")
    rollback = run.rollback(nodes=nodes)

    assert asyncio.run(rollback.rollbacks("completed", None)) is True
    assert asyncio.run(rollback.rollbacks("completed", None)) is True  # once per fault

    assert nodes.calls == [(["node0"], entry.injected_at)]
    assert [r.name for r in run.journal.rollbacks] == [
        "undo",
        "return-nodes-to-service",
        "undo",
    ]


def test_nodes_all_in_service_after_the_revert_leave_no_journal_record(tmp_path: Path) -> None:
    run = Run(tmp_path, _yaml(FREEZE, rollbacks="  - {type: revert, name: undo}"))
    asyncio.run(run.method(StandInSender(run.ledger)).run())
    nodes = StandInNodes("in service")

    assert asyncio.run(run.rollback(nodes=nodes).rollbacks("completed", None)) is True

    assert [c[0] for c in nodes.calls] == [["node0"]]
    assert [r.name for r in run.journal.rollbacks] == ["undo"]


def test_a_fault_that_was_not_reverted_leaves_its_nodes_alone(tmp_path: Path) -> None:
    run = Run(tmp_path, _yaml(FREEZE))
    asyncio.run(run.method(StandInSender(run.ledger)).run())
    nodes = StandInNodes("resumed")
    reverter = StandInReverter(run.ledger, refuse=[f"{ID}.freeze"])

    assert asyncio.run(run.rollback(reverter, nodes).cleanup("completed")) is False

    assert nodes.calls == []
    assert [r.name for r in run.journal.cleanup] == ["revert-open-faults"]


def test_the_rollback_executor_reverts_what_the_method_executor_recorded_even_when_the_method_raised(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, _yaml(f"{FREEZE}\n  - {{type: probe, name: check, provider: {FAILS}}}"))
    method = run.method(StandInSender(run.ledger))

    with pytest.raises(ActivityFailed, match="method probe check"):
        asyncio.run(method.run())
    [entry] = run.faults.open_faults()
    assert entry.id == f"{ID}.freeze"

    assert asyncio.run(run.rollback().cleanup("failed")) is True

    assert run.faults.open_faults() == []
    [closed] = run.faults.entries()
    assert closed.state == "reverted" and closed.revert_reason == "end of experiment"
    assert [(r.name, r.status) for r in run.journal.cleanup] == [
        ("revert-open-faults", "succeeded")
    ]
    assert load_journal(run.path).cleanup[0].output == [
        {"fault_id": f"{ID}.freeze", "ok": True, "detail": "undone"}
    ]


def test_the_rollback_executor_cleanup_after_an_abort_says_abort_and_has_nothing_to_do_when_all_is_closed(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, _yaml(FREEZE))
    asyncio.run(run.method(StandInSender(run.ledger)).run())
    reverter = StandInReverter(run.ledger)

    assert asyncio.run(run.rollback(reverter).cleanup("aborted")) is True
    assert asyncio.run(run.rollback(reverter).cleanup("aborted")) is True

    assert reverter.reasons == ["abort"]
    assert len(run.journal.cleanup) == 1


def test_a_fault_that_cannot_be_reverted_fails_the_cleanup_and_stays_open(tmp_path: Path) -> None:
    run = Run(tmp_path, _yaml(FREEZE))
    asyncio.run(run.method(StandInSender(run.ledger)).run())
    reverter = StandInReverter(run.ledger, refuse=[f"{ID}.freeze"])

    assert asyncio.run(run.rollback(reverter).cleanup("completed")) is False

    [record] = run.journal.cleanup
    assert record.status == "failed" and record.error == f"{ID}.freeze: refused"
    assert [e.id for e in run.faults.open_faults()] == [f"{ID}.freeze"]
    assert any("could NOT revert" in line for line in run.said.events)
    assert "fault-revert-failed" in run.annotator.kept[-1][1]


@pytest.mark.parametrize(
    ("strategy", "status", "met_before", "runs"),
    [
        ("always", "aborted", False, True),
        ("never", "deviated", True, False),
        ("deviated", "deviated", True, True),
        ("deviated", "completed", True, False),
        ("default", "completed", True, True),
        ("default", "failed", None, True),
        ("default", "failed", False, False),
        ("default", "aborted", True, False),
    ],
)
def test_rollbacks_run_per_chaostoolkits_strategies(
    strategy: RollbackStrategy, status: ExperimentStatus, met_before: bool | None, runs: bool
) -> None:
    assert rollbacks_run(strategy, status, met_before=met_before) is runs


def test_rollbacks_the_strategy_skips_are_journaled_as_skipped_with_the_reason(
    tmp_path: Path,
) -> None:
    run = Run(
        tmp_path,
        _yaml(FREEZE, rollbacks="  - {type: revert, name: undo}", strategy="deviated"),
    )

    assert asyncio.run(run.rollback().rollbacks("completed", None)) is True

    [record] = run.journal.rollbacks
    assert (record.name, record.status) == ("undo", "skipped")
    assert record.output == {"reason": "rollback_strategy 'deviated' and status 'completed'"}


def test_a_failing_rollback_never_skips_the_next_one(tmp_path: Path) -> None:
    rollbacks = (
        f"  - {{type: probe, name: check, provider: {FAILS}}}\n  - {{type: revert, name: undo}}"
    )
    run = Run(tmp_path, _yaml(FREEZE, rollbacks=rollbacks))
    asyncio.run(run.method(StandInSender(run.ledger)).run())

    # No job was opened: the probe rollback cannot run; the revert still does.
    assert asyncio.run(run.rollback().rollbacks("failed", None)) is False

    assert [(r.name, r.status) for r in run.journal.rollbacks] == [("undo", "succeeded")]
    assert run.faults.open_faults() == []

    assert asyncio.run(run.rollback().rollbacks("failed", run.probes())) is False
    assert [(r.name, r.status) for r in run.journal.rollbacks][1:] == [
        ("check", "failed"),
        ("undo", "succeeded"),
    ]


class LedgerOfADeadController(Ledger):
    """A ledger whose open faults of experiment ``old`` were left by a controller that died
    (tests/chaos/test_ledger.py kills a real one)."""

    def orphans(self) -> list[LedgerEntry]:
        return self.open_faults(experiment_id="old")


def test_an_orphan_that_cannot_be_reverted_stops_the_run_before_anything_is_injected(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, _yaml(FREEZE))
    run.ledger = LedgerOfADeadController(run.ledger.path)
    run.faults = FaultTracker(run.ledger, ID)
    run.ledger.record(
        fault_id="old.freeze",
        experiment_id="old",
        spec=FreezeRankFault(kind="freeze_rank", rank=0),
        target=FaultTarget(job="unit", rank=0),
        expires_at=time.time() + 60,
    )
    refusing = StandInReverter(run.ledger, refuse=["old.freeze"])

    with pytest.raises(ActivityFailed, match="could not revert 1 orphaned fault"):
        asyncio.run(run.rollback(refusing).recover_orphans())
    assert [(r.name, r.status) for r in run.journal.recovery] == [
        ("revert-orphaned-faults", "failed")
    ]

    asyncio.run(run.rollback().recover_orphans())
    assert run.ledger.get("old.freeze").revert_reason == "controller start"


# -- the method executor --------------------------------------------------------------------


def test_the_method_executor_journals_the_activities_after_a_failure_as_skipped(
    tmp_path: Path,
) -> None:
    method = (
        f"  - {{type: probe, name: check, provider: {FAILS}}}\n{FREEZE}\n"
        "  - {type: pause, name: hold, seconds: 5}"
    )
    run = Run(tmp_path, _yaml(method))

    with pytest.raises(ActivityFailed):
        asyncio.run(run.method(StandInSender(run.ledger)).run())

    assert [(r.name, r.status) for r in run.journal.method] == [
        ("check", "failed"),
        ("freeze", "skipped"),
        ("hold", "skipped"),
    ]
    assert run.faults.entries() == []


def test_the_method_executor_waits_for_the_step_and_notes_each_fault_in_the_tracker(
    tmp_path: Path,
) -> None:
    freeze_at_7 = """  - type: action
    name: freeze
    fault: {kind: freeze_rank, rank: 0, ttl_seconds: 60}
    when: {step: 7}"""
    run = Run(tmp_path, _yaml(f"{freeze_at_7}\n{KILL}"))
    sender = StandInSender(run.ledger)
    before = time.time()

    asyncio.run(run.method(sender).run())

    assert sender.waited == [(7, 0)]
    assert run.faults.self_reverting == ("kill",)
    assert run.faults.last_fault_at is not None and run.faults.last_fault_at >= before
    freeze, kill = run.journal.method
    assert isinstance(freeze.output, dict) and freeze.output["step"] == 7
    assert freeze.output["fault_id"] == f"{ID}.freeze" and freeze.output["kind"] == "freeze_rank"
    assert isinstance(kill.output, dict) and kill.output["step"] is None
    texts = [text for text, _ in run.annotator.kept]
    assert texts[0].startswith(f"fault {ID}.freeze injected: freeze_rank on rank 0 (node0)")
    assert all(
        tags[:3] == ("stormwatch", "chaos", f"experiment:{ID}") for _, tags in run.annotator.kept
    )


def test_the_method_executor_refuses_an_experiment_beyond_its_blast_radius(tmp_path: Path) -> None:
    method = "  - {type: action, name: kill, target: {ranks: [0, 1]}, fault: {kind: kill_rank}}"
    run = Run(tmp_path, _yaml(method, extra="blast_radius: {max_fraction_of_ranks: 0.5}"))

    with pytest.raises(ChaosError, match="blast radius"):
        run.method(StandInSender(run.ledger), Shape(("node0",), 2)).check_blast_radius()
    with pytest.raises(ChaosError, match="cannot place the faults"):
        run.method(StandInSender(run.ledger), Shape(("node0",), 1)).check_blast_radius()
    run.method(StandInSender(run.ledger), Shape(("node0", "node1"), 2)).check_blast_radius()


def test_a_job_is_spread_evenly_over_the_targets_agents(tmp_path: Path) -> None:
    agents = tuple(AgentEndpoint(node=f"n{i}", url=f"http://n{i}") for i in range(2))
    target = Target(run_dir=tmp_path, jobs=AttachedJobs(tmp_path, world_size=4), world_size=4)
    job = JobRef(name="j", log_dir=tmp_path, world_size=4, started_by_runner=False)

    assert job_shape(target, job) == Shape(("node0",), 4)
    with_agents = Target(run_dir=tmp_path, jobs=target.jobs, world_size=4, agents=agents)
    assert job_shape(with_agents, job) == Shape(("n0", "n1"), 2)
    odd = job.model_copy(update={"world_size": 3})
    assert job_shape(with_agents, odd) == Shape(("node0",), 3)


# -- probes, the hypothesis and the safeguards ----------------------------------------------


def test_the_hypothesis_checker_adds_a_recovery_check_only_after_a_fault_that_reverts_itself(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, _yaml(KILL))
    run.step(3)
    hypothesis = HypothesisChecker(
        run.ctx, probes=run.probes(), faults=run.faults, recovery_timeout_seconds=0
    )

    assert asyncio.run(hypothesis.check("before")) is True
    asyncio.run(run.method(StandInSender(run.ledger)).run())
    run.step(4, at=time.time() + 60)  # a step after the fault
    assert asyncio.run(hypothesis.check("after")) is True

    assert [r.name for r in run.journal.steady_state_before.probes] == ["rank-steps"]
    assert [(r.name, r.status) for r in run.journal.steady_state_after.probes] == [
        ("job-recovered", "succeeded"),  # recovery first, then the experiment's own probes
        ("rank-steps", "succeeded"),
    ]
    assert run.journal.steady_state_before.met and run.journal.steady_state_after.met
    assert load_journal(run.path).steady_state_after.met is True


def test_a_probe_that_does_not_hold_is_a_failed_record_not_an_exception(tmp_path: Path) -> None:
    run = Run(tmp_path, _yaml(FREEZE, probe=FAILS))
    hypothesis = HypothesisChecker(
        run.ctx, probes=run.probes(), faults=run.faults, recovery_timeout_seconds=0
    )

    assert asyncio.run(hypothesis.check("before")) is False

    [record] = run.journal.steady_state_before.probes
    assert record.status == "failed" and record.error == "no HTTP session"
    assert run.journal.steady_state_before.met is False
    assert run.said.events[-1] == "  rank-steps: did NOT hold: no HTTP session"


def test_probes_see_the_latest_fault_time_and_the_jobs_placeholders(tmp_path: Path) -> None:
    run = Run(tmp_path, _yaml(FREEZE))
    probes = run.probes()
    assert probes.context().since is None

    asyncio.run(run.method(StandInSender(run.ledger)).run())

    assert probes.context().since == run.faults.last_fault_at
    assert probes.context().variables == {
        "job": "unit",
        "steps": "100",
        "checkpoint_every": "10",
        "world_size": "1",
    }


async def _status_after(seconds: float, status: ExperimentStatus) -> ExperimentStatus:
    await asyncio.sleep(seconds)
    return status


def test_a_tripped_safeguard_cancels_the_method_and_fails_the_run(tmp_path: Path) -> None:
    safeguards = f"safeguards:\n  - {{name: service-up, provider: {FAILS}}}"
    run = Run(tmp_path, _yaml(FREEZE, extra=safeguards))
    watcher = SafeguardWatcher(run.ctx, context=run.probes().context)
    started = time.monotonic()

    assert asyncio.run(watcher.guard(_status_after(30, "completed"))) == "failed"

    assert time.monotonic() - started < 10
    [record] = run.journal.method
    assert (record.name, record.type, record.status) == ("service-up", "safeguard", "failed")
    assert run.journal.error == (
        "safeguard service-up tripped: no HTTP session; injection stopped, rolled back"
    )


def test_without_safeguards_the_watcher_returns_what_the_method_returned(tmp_path: Path) -> None:
    run = Run(tmp_path, _yaml(FREEZE))
    watcher = SafeguardWatcher(run.ctx, context=run.probes().context)

    assert asyncio.run(watcher.guard(_status_after(0, "deviated"))) == "deviated"
    assert run.journal.method == [] and run.journal.error is None


# -- the job -------------------------------------------------------------------------------


class StandInJobs(AttachedJobs):
    """Attached jobs that can also be "started" (their logs are written by the test)."""

    def __init__(self, run_dir: Path, *, ended: bool) -> None:
        super().__init__(run_dir, world_size=1)
        self._ended = ended
        self.stopped: list[str] = []

    def start(self, job: JobSection) -> JobRef:
        return JobRef(
            name=job.name, log_dir=self.log_dir(job.name), world_size=1, started_by_runner=True
        )

    def ended(self, name: str) -> bool:
        return self._ended

    def stop(self, name: str) -> None:
        self.stopped.append(name)


def test_the_job_lifecycle_starts_a_fresh_job_and_keeps_where_its_ranks_were_first_seen(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, _yaml(FREEZE))
    jobs = StandInJobs(run.run_dir, ended=False)
    name = job_name_for("unit", ID)
    run.job = JobRef(name=name, log_dir=jobs.log_dir(name), world_size=1, started_by_runner=True)
    run.step(12)
    lifecycle = JobLifecycle(run.ctx, jobs=jobs, attach_job=None, job_end_timeout_seconds=60)

    job = asyncio.run(lifecycle.open())

    assert job.name == name and job.started_by_runner
    assert lifecycle.job == job == run.journal.job
    assert lifecycle.first_seen_steps == {0: 12}
    [record] = run.journal.warmup
    assert (record.name, record.status) == ("job", "succeeded")
    assert isinstance(record.output, dict) and record.output["first_seen_steps"] == {"0": 12}

    asyncio.run(lifecycle.wait_for_end("failed"))  # nothing watches it any more: stopped at once
    assert jobs.stopped == [name]


def test_the_job_lifecycle_never_stops_a_job_it_attached_to(tmp_path: Path) -> None:
    run = Run(tmp_path, _yaml(FREEZE))
    run.step(1)
    jobs = StandInJobs(run.run_dir, ended=False)
    lifecycle = JobLifecycle(run.ctx, jobs=jobs, attach_job="unit", job_end_timeout_seconds=0)

    assert asyncio.run(lifecycle.open()).started_by_runner is False
    asyncio.run(lifecycle.wait_for_end("aborted"))

    assert jobs.stopped == []
    assert run.said.events == ["attached to job unit"]
