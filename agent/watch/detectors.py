"""Rank-health detectors: hangs, compute stragglers, collective lag (pure, no I/O).

The detectors consume what the rank-health monitor (:mod:`.rank_health`) reads
from the trainer's multiprocess files each scan and return *transitions*
(a rank became hung / recovered, became a straggler / stopped being one), so they
can be driven from recorded sequences in tests.

Hang (FC-10): a running rank whose last heartbeat (the later of
``stormwatch_train_last_step_timestamp_seconds`` and the progress heartbeat
``stormwatch_train_last_progress_timestamp_seconds``, which completed collectives,
phase boundaries and checkpoints advance too) is older than its *stall threshold* is
hung, unless it is inside a phase that legitimately pauses progress and the phase's
deadline (``stormwatch_train_phase_deadline_timestamp_seconds``: entry + the phase's
bound, :mod:`stormwatch.telemetry.phases`; ``stopping`` from SIGTERM on) is still ahead;
past the deadline it is judged by its heartbeat again, and its hang is named by the
phase (``phase`` of the event: e.g. the start-up stage ``mesh`` of a rank that never
reached its first step). The threshold adapts to the job:

* **warm**: ``max(floor_seconds, factor x median step time)``, the median over the last
  ``window`` step times of *that job's* ranks on this node, each measured as (step
  heartbeat advance) ÷ (step advance) between two scans. Defaults floor 5 s, factor 3
  (:class:`HangSettings`): issue 18's target, "a hang is detected within
  max(3 x the job's median step time, 5 s)"; a job with 2-minute steps waits 6 minutes,
  one with 0.3 s steps 5 s.
* **warming up**: ``max(warmup_seconds, warm threshold)`` until the rank's *current
  process* has completed ``warmup_steps`` steps (default 60 s, 3 steps). A new process
  (a first start, a restart by torchrun, an elastic resize) imports, joins the
  rendezvous, loads a checkpoint and runs first steps that build communicators and
  caches: seconds to minutes with no step time to scale by. Its start-up stages are
  phases too, so this bounds only what falls outside them (the interpreter's start
  before ``stormwatch.telemetry.init``, the first steps). The warm-up counts from the
  process's start: until a new process reports, its heartbeat is its predecessor's (the
  agent keeps a rank's last heartbeat), and the threshold grows by the time from that
  heartbeat to the new process's start (a rank rejoining minutes after its node was out
  is not hung on arrival).

Entering a phase is a heartbeat, so a rank that marks the start-up stages
(``rendezvous``, ``mesh``, ``parallelize``, ``checkpoint_load``) is judged from before
its process group exists: a rank stuck in a stage is hung once the stage's deadline has
passed and its heartbeat is older than the threshold. The agent exports each running
rank's threshold (``stormwatch_rank_stall_threshold_seconds``), which the Prometheus
rules compare with the same heartbeat, so the rules and the agent agree. One episode
lasts from detection until the heartbeat advances (or the rank exits); each episode
counts once. A rank without any heartbeat yet (absent, or 0: it marked no stage) is
never hung here: its start-up has no step time or deadline to compare with; the job's
collective timeout bounds it.

Straggler (FC-14): per new step sample of a rank (its ``stormwatch_train_step``
advanced), ``score = compute ÷ median(peers' compute)`` with
``stormwatch_train_step_compute_seconds`` and the peers being the job's other
ranks on this node. The sample is *slow* when ``score >= factor`` **and** the
peers' median ``stormwatch_train_step_collective_wait_seconds`` exceeds the
rank's own wait (they wait for it in collectives). ``samples`` consecutive slow
samples flag the rank; one sample that is not slow clears it. Defaults: factor
1.2, samples 3 (:class:`StragglerSettings`). A rank that waits (high wait,
normal compute) scores about 1 and is never flagged. Needs at least two ranks of
the job on this node (cross-node comparisons belong to Prometheus rules).

Collective lag: ``lag = max(count of the job's ranks) - count(rank)`` over
``stormwatch_collective_calls_total`` (summed over ``op``) of the job's ranks on
this node: the rank with the highest lag is the one behind in the collective
sequence.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Iterable, Mapping

from stormwatch.agent.errors import AgentConfigError
from stormwatch.contracts.rank_env import RankKey

HANG = "rank_hang"
HANG_CLEARED = "rank_hang_cleared"
STRAGGLER = "rank_straggler"
STRAGGLER_CLEARED = "rank_straggler_cleared"


@dataclasses.dataclass(frozen=True)
class HangSettings:
    """Stall threshold: ``max(floor_seconds, factor x median step time)``, at least
    ``warmup_seconds`` until the rank's process has completed ``warmup_steps`` steps.

    Attributes:
        floor_seconds: smallest threshold, seconds (5: issue 18's detection target,
            max(3 x median step, 5 s); checkpoint saves, evaluation and stops are phases
            with their own bounds, so the floor need not cover them).
        factor: multiple of the job's recent median step time (3: the same target; a step
            three times slower than the median is no longer jitter in a synchronous job).
        window: step times kept per job for the median (64).
        warmup_steps: steps a new process completes before the warm threshold applies (3).
        warmup_seconds: threshold until then, seconds (60: a torchrun restart of a
            4-rank job on the loaded 2-core lab took up to ~30 s from the kill to the
            first heartbeat; twice that).

    Raises:
        AgentConfigError: a value is not positive (names the field).
    """

    floor_seconds: float = 5.0
    factor: float = 3.0
    window: int = 64
    warmup_steps: int = 3
    warmup_seconds: float = 60.0

    def __post_init__(self) -> None:
        for name in ("floor_seconds", "factor", "window", "warmup_steps", "warmup_seconds"):
            if not getattr(self, name) > 0:
                raise AgentConfigError(f"hang {name}: must be > 0 (got {getattr(self, name)})")


@dataclasses.dataclass(frozen=True)
class StragglerSettings:
    """Straggler rule: ``samples`` consecutive steps with compute >= ``factor`` x peers' median.

    Attributes:
        factor: compute ÷ peers' median compute at or above which a step is slow (1.2).
        samples: consecutive slow steps before the rank is flagged (3).

    Raises:
        AgentConfigError: factor not > 1 or samples < 1 (names the field).
    """

    factor: float = 1.2
    samples: int = 3

    def __post_init__(self) -> None:
        if not self.factor > 1.0:
            raise AgentConfigError(f"straggler factor: must be > 1 (got {self.factor})")
        if self.samples < 1:
            raise AgentConfigError(f"straggler samples: must be >= 1 (got {self.samples})")


@dataclasses.dataclass(frozen=True)
class RankProgress:
    """One rank's progress at a scan: running?, last heartbeat (Unix s), last step.

    Attributes:
        heartbeat: the later of the step and progress heartbeats (what hangs are judged by).
        step_heartbeat: the step heartbeat alone (step times are measured on it);
            ``None``: use ``heartbeat``.
        paused_until: Unix time until which a phase excuses the rank (0: none).
        phase: the phase whose deadline that is (``None``: in no phase).
        started_at: the process's start (Unix s); a new value is a new process, which
            warms up again (``None``: unknown, one process).
    """

    key: RankKey
    alive: bool
    heartbeat: float | None
    step: float | None
    step_heartbeat: float | None = None
    paused_until: float = 0.0
    phase: str | None = None
    started_at: float | None = None


@dataclasses.dataclass(frozen=True)
class StepSample:
    """One rank's per-step gauges: step number, compute and collective wait (seconds)."""

    key: RankKey
    step: float
    compute: float
    wait: float


@dataclasses.dataclass(frozen=True)
class Transition:
    """A detector's state change: ``kind`` is one of the module's event kinds."""

    kind: str
    key: RankKey
    details: Mapping[str, float | int | str | None]


class HangDetector:
    """Tracks hangs per rank (see the module docstring)."""

    def __init__(self, settings: HangSettings | None = None) -> None:
        self.settings = settings or HangSettings()
        # key -> (step heartbeat, step) at the previous scan
        self._last: dict[RankKey, tuple[float, float | None]] = {}
        self._times: dict[str, collections.deque[float]] = {}
        self._hung: dict[RankKey, float] = {}  # key -> heartbeat it hung at
        self._episodes: collections.Counter[RankKey] = collections.Counter()
        # key -> (the process's start, steps it completed): its warm-up
        self._warmup: dict[RankKey, tuple[float | None, int]] = {}
        # key -> seconds from the heartbeat to the start of the process that has not
        # reported yet (its heartbeat is still its predecessor's)
        self._inherited: dict[RankKey, float] = {}

    def threshold(self, job: str) -> float:
        """Seconds without a heartbeat after which a warm rank of ``job`` is hung:
        ``max(floor, factor x median step)``; ``warmup_seconds`` before any step time."""
        median = self.median_step_seconds(job)
        if median is None:
            return max(self.settings.warmup_seconds, self.settings.floor_seconds)
        return max(self.settings.floor_seconds, self.settings.factor * median)

    def rank_threshold(self, key: RankKey) -> float:
        """The stall threshold of rank ``key`` now: the job's, at least ``warmup_seconds``
        while its process has completed fewer than ``warmup_steps`` steps; plus, while
        its heartbeat is still a predecessor's (a new process that has not reported yet,
        e.g. a rank that rejoins after its node was out), the time from that heartbeat to
        the process's start, so that its warm-up counts from its own start."""
        limit = self.threshold(key[0])
        if self.warming_up(key):
            limit = max(limit, self.settings.warmup_seconds)
        return limit + self._inherited.get(key, 0.0)

    def warming_up(self, key: RankKey) -> bool:
        """Whether rank ``key``'s current process has completed fewer than
        ``warmup_steps`` steps (True for a rank never seen)."""
        return self._warmup.get(key, (None, 0))[1] < self.settings.warmup_steps

    def thresholds(self) -> dict[RankKey, float]:
        """:meth:`rank_threshold` of every rank seen at the last scan."""
        return {key: self.rank_threshold(key) for key in self._last}

    def median_step_seconds(self, job: str) -> float | None:
        """Median of the job's recent step times on this node, or None before any."""
        times = self._times.get(job)
        return statistics.median(times) if times else None

    def hung(self) -> dict[RankKey, bool]:
        """Hung state of every rank seen (False once recovered)."""
        return {key: key in self._hung for key in self._last}

    def episodes(self) -> dict[RankKey, int]:
        """Hang episodes per rank since start (never decreases)."""
        return {key: self._episodes.get(key, 0) for key in self._last}

    def observe(self, now: float, ranks: Iterable[RankProgress]) -> list[Transition]:
        """Feed one scan; returns the hangs detected and cleared by it."""
        out: list[Transition] = []
        # 0 is a heartbeat gauge created but never set: no step completed yet.
        current = [r for r in ranks if r.heartbeat is not None and r.heartbeat > 0]
        for r in current:
            self._step_time(r)
        self._inherited = {}
        for r in current:
            if r.alive and r.heartbeat is not None and (r.started_at or 0.0) > r.heartbeat:
                self._inherited[r.key] = (r.started_at or 0.0) - r.heartbeat
        seen = {r.key for r in current}
        for r in current:
            assert r.heartbeat is not None
            age = now - r.heartbeat
            limit = self.rank_threshold(r.key)
            if r.key in self._hung:
                if not r.alive or r.heartbeat > self._hung[r.key]:
                    del self._hung[r.key]
                    reason = "progress" if r.alive else "exited"
                    out.append(Transition(HANG_CLEARED, r.key, {"reason": reason, "step": r.step}))
            elif r.alive and age > limit and r.paused_until <= now:
                self._hung[r.key] = r.heartbeat
                self._episodes[r.key] += 1
                median = self.median_step_seconds(r.key[0])
                details: dict[str, float | int | str | None] = {
                    "heartbeat": r.heartbeat,
                    "age_seconds": round(age, 3),
                    "threshold_seconds": round(limit, 3),
                    "median_step_seconds": median,
                    "warming_up": int(self.warming_up(r.key)),
                    "step": r.step,
                }
                if r.phase is not None:
                    details.update(phase=r.phase, phase_deadline=r.paused_until)
                out.append(Transition(HANG, r.key, details))
        for key in list(self._hung):
            if key not in seen:  # the rank and its heartbeat are gone
                del self._hung[key]
                out.append(Transition(HANG_CLEARED, key, {"reason": "forgotten", "step": None}))
        for key in list(self._warmup):
            if key not in seen:
                del self._warmup[key]
        return out

    def _step_time(self, r: RankProgress) -> None:
        """Note one step time of ``r``'s job when its step and step heartbeat advanced,
        and count the step towards the warm-up of ``r``'s current process."""
        started, done = self._warmup.get(r.key, (r.started_at, 0))
        if r.started_at != started:  # a new process: it warms up again
            started, done = r.started_at, 0
            self._last.pop(r.key, None)  # a step time across the restart is not one
        beat = r.step_heartbeat if r.step_heartbeat is not None else r.heartbeat
        if beat is None:
            self._warmup[r.key] = (started, done)
            return
        previous = self._last.get(r.key)
        if previous is not None and beat > previous[0]:
            stepped = None if r.step is None or previous[1] is None else r.step - previous[1]
            if stepped is not None and stepped > 0:
                times = self._times.setdefault(
                    r.key[0], collections.deque(maxlen=self.settings.window)
                )
                times.append((beat - previous[0]) / stepped)
                if started is None or previous[0] >= started:  # a step of this process
                    done += int(stepped)
        self._warmup[r.key] = (started, done)
        self._last[r.key] = (beat, r.step)


class StragglerDetector:
    """Tracks compute stragglers per rank (see the module docstring)."""

    def __init__(self, settings: StragglerSettings | None = None) -> None:
        self.settings = settings or StragglerSettings()
        self._steps: dict[RankKey, float] = {}
        self._streak: collections.Counter[RankKey] = collections.Counter()
        self._flagged: set[RankKey] = set()
        self._scores: dict[RankKey, float] = {}

    def scores(self) -> dict[RankKey, float]:
        """Latest ``compute ÷ peers' median compute`` per rank that has peers."""
        return dict(self._scores)

    def flagged(self) -> dict[RankKey, bool]:
        """Straggler state of every scored rank."""
        return {key: key in self._flagged for key in self._scores}

    def observe(self, samples: Iterable[StepSample]) -> list[Transition]:
        """Feed the current per-step gauges of the node's ranks; returns state changes."""
        by_job: dict[str, list[StepSample]] = collections.defaultdict(list)
        for sample in samples:
            by_job[sample.key[0]].append(sample)
        live = {s.key for group in by_job.values() for s in group}
        out: list[Transition] = []
        for group in by_job.values():
            for sample in group:
                peers = [p for p in group if p.key != sample.key]
                if not peers:
                    continue
                peer_compute = statistics.median(p.compute for p in peers)
                peer_wait = statistics.median(p.wait for p in peers)
                if peer_compute <= 0:
                    continue
                score = sample.compute / peer_compute
                self._scores[sample.key] = score
                if self._steps.get(sample.key) == sample.step:
                    continue  # not a new step: the gauges have not changed
                self._steps[sample.key] = sample.step
                slow = score >= self.settings.factor and peer_wait > sample.wait
                out.extend(self._advance(sample, slow, score, peer_compute, peer_wait))
        for key in list(self._scores):
            if key not in live:
                self._scores.pop(key)
                self._steps.pop(key, None)
                self._streak.pop(key, None)
                if key in self._flagged:
                    self._flagged.discard(key)
                    out.append(Transition(STRAGGLER_CLEARED, key, {"reason": "gone"}))
        return out

    def _advance(
        self, sample: StepSample, slow: bool, score: float, peer_compute: float, peer_wait: float
    ) -> list[Transition]:
        key = sample.key
        details = {
            "step": sample.step,
            "score": round(score, 4),
            "compute_seconds": sample.compute,
            "wait_seconds": sample.wait,
            "peers_median_compute_seconds": peer_compute,
            "peers_median_wait_seconds": peer_wait,
        }
        if not slow:
            self._streak[key] = 0
            if key in self._flagged:
                self._flagged.discard(key)
                return [Transition(STRAGGLER_CLEARED, key, details)]
            return []
        self._streak[key] += 1
        if key not in self._flagged and self._streak[key] >= self.settings.samples:
            self._flagged.add(key)
            return [Transition(STRAGGLER, key, details)]
        return []


def collective_lag(counts: Mapping[RankKey, float]) -> dict[RankKey, float]:
    """Collectives each rank is behind its job's most advanced rank on this node."""
    top: dict[str, float] = {}
    for (job, _), n in counts.items():
        top[job] = max(n, top.get(job, n))
    return {key: top[key[0]] - n for key, n in counts.items()}


__all__ = [
    "HANG",
    "HANG_CLEARED",
    "STRAGGLER",
    "STRAGGLER_CLEARED",
    "HangDetector",
    "HangSettings",
    "RankProgress",
    "StepSample",
    "StragglerDetector",
    "StragglerSettings",
    "Transition",
    "collective_lag",
]
