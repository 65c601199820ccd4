"""Rank-health detectors: hangs, compute stragglers, collective lag (pure, no I/O).

The detectors consume what the rank-health monitor (:mod:`.rank_health`) reads
from the trainer's multiprocess files each scan and return *transitions*
(a rank became hung / recovered, became a straggler / stopped being one), so they
can be driven from recorded sequences in tests.

Hang (FC-10, issue 18): a running rank whose last heartbeat (the later of
``stormwatch_train_last_step_timestamp_seconds`` and the progress heartbeat
``stormwatch_train_last_progress_timestamp_seconds``, which completed collectives,
phase boundaries and checkpoints advance too) is older than the rank's *stall
threshold* is hung, unless it is inside a phase that legitimately pauses progress and
the phase's deadline (``stormwatch_train_phase_deadline_timestamp_seconds``: entry +
the phase's bound, :mod:`stormwatch.telemetry.phases`) is still ahead; past the
deadline it is judged by its heartbeat again, and its hang is named by the phase
(``phase`` of the event: e.g. the start-up stage ``mesh`` of a rank that never reached
its first step). Entering a phase is a heartbeat, so a rank that marks the start-up
stages (``rendezvous``, ``mesh``, ``parallelize``, ``checkpoint_load``) is judged from
before its process group exists.

The threshold adapts to the job (:class:`StepStats`, per job over the step times of
its ranks on this node, each measured as (step heartbeat advance) ÷ (step advance)
between two scans, the last ``window`` kept):

* warm (at least ``min_samples`` step times): ``max(floor_seconds, factor x median,
  median + spread x 1.4826 x MAD)``; defaults 5 s, 3, 6: a steady job is late after
  three of its own steps (issue 18's target is max(3 x median step, 5 s) + 2 s), a
  jittery one only beyond six robust standard deviations of its own spread;
* cold (fewer step times: a new job, and again after a restart or an elastic resize,
  which start new processes and may change the step time): ``max(cold_seconds,
  factor x the longest step time seen)`` (30 s, the threshold before adaptive
  detection; a minute-long step is not late after 30 s while the job warms up);
* a rank whose process started after its last heartbeat (torchrun restarted it and it
  has marked nothing yet) is judged from its process start with the cold threshold:
  a restart is not a hang. :meth:`HangDetector.thresholds` exports that as a
  threshold on the heartbeat's age (``cold + start - heartbeat``), so the rules judge
  ``time() - heartbeat`` the same way.

One episode lasts from detection until the heartbeat advances (or the rank exits);
each episode counts once. A rank without any heartbeat yet (absent, or 0: it marked no
stage) is never hung here: its start-up has no step time or deadline to compare with;
the job's collective timeout bounds it.

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
    """Stall threshold (see the module docstring for how the parts combine).

    Attributes:
        floor_seconds: smallest warm threshold, seconds (5: issue 18's target for
            sub-second jobs, max(3 x median, 5 s); below it scrape and evaluation
            jitter of a 1 s Prometheus would dominate).
        factor: multiple of the job's median step time (3: three steps without a
            heartbeat are no longer jitter; issue 18's target).
        spread: robust standard deviations (1.4826 x MAD) above the median (6: a
            jittery job widens its own threshold; for a normal spread a false
            alarm every ~10^9 steps).
        window: step times kept per job for the statistics (64).
        min_samples: step times needed before the job's statistics are used (5; the
            warm-up, again after every restart or resize).
        cold_seconds: threshold while the job is warming up, and for a rank that
            restarted and marked nothing yet (30 s: the fixed threshold before
            adaptive detection, longer than a first step on the lab).

    Raises:
        AgentConfigError: a value is not positive (names the field).
    """

    floor_seconds: float = 5.0
    factor: float = 3.0
    spread: float = 6.0
    window: int = 64
    min_samples: int = 5
    cold_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("floor_seconds", "factor", "spread", "window", "min_samples", "cold_seconds"):
            if not getattr(self, name) > 0:
                raise AgentConfigError(f"hang {name}: must be > 0 (got {getattr(self, name)})")


#: MAD x this = the standard deviation of a normal distribution.
MAD_TO_SIGMA = 1.4826


class StepStats:
    """Rolling step-time statistics of one job: median and MAD over the last ``window``.

    ``reset()`` forgets them (a restart or resize: the job warms up again).
    """

    def __init__(self, settings: HangSettings) -> None:
        self.settings = settings
        self._times: collections.deque[float] = collections.deque(maxlen=settings.window)

    def add(self, seconds: float) -> None:
        self._times.append(seconds)

    def reset(self) -> None:
        self._times.clear()

    @property
    def warm(self) -> bool:
        """At least ``min_samples`` step times are known."""
        return len(self._times) >= self.settings.min_samples

    def median(self) -> float | None:
        """Median step time (s), or None before any step time."""
        return statistics.median(self._times) if self._times else None

    def mad(self) -> float | None:
        """Median absolute deviation of the step times (s), or None before any."""
        median = self.median()
        if median is None:
            return None
        return statistics.median(abs(t - median) for t in self._times)

    def threshold(self) -> float:
        """Heartbeat age (s) beyond which a rank of the job is late (module docstring)."""
        s = self.settings
        median, mad = self.median(), self.mad()
        if not self.warm or median is None or mad is None:
            return max([s.cold_seconds, *(s.factor * t for t in self._times)])
        return max(s.floor_seconds, s.factor * median, median + s.spread * MAD_TO_SIGMA * mad)


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
        started_at: Unix time the rank's current process started (``None``: unknown);
            a new one means a restart (the job's statistics warm up again).
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
        self._stats: dict[str, StepStats] = {}
        self._started: dict[RankKey, float] = {}  # key -> start of its current process
        self._current: dict[RankKey, RankProgress] = {}  # the last scan's live ranks
        self._hung: dict[RankKey, float] = {}  # key -> heartbeat it hung at
        self._episodes: collections.Counter[RankKey] = collections.Counter()

    def _job(self, job: str) -> StepStats:
        stats = self._stats.get(job)
        if stats is None:
            stats = self._stats[job] = StepStats(self.settings)
        return stats

    def threshold(self, job: str) -> float:
        """Seconds without a heartbeat after which a rank of ``job`` is hung."""
        return self._job(job).threshold()

    def median_step_seconds(self, job: str) -> float | None:
        """Median of the job's recent step times on this node, or None before any."""
        stats = self._stats.get(job)
        return None if stats is None else stats.median()

    def step_medians(self) -> dict[str, float]:
        """Median step time (s) of every job that is warm (``min_samples`` step times)."""
        out = {}
        for job, stats in self._stats.items():
            median = stats.median()
            if stats.warm and median is not None:
                out[job] = median
        return out

    def _starting(self, r: RankProgress) -> bool:
        """The rank's process started after its last heartbeat: restarted, nothing marked."""
        return r.started_at is not None and r.heartbeat is not None and r.heartbeat < r.started_at

    def _limit(self, r: RankProgress) -> float:
        """Threshold on ``now - r.heartbeat`` for this rank (module docstring)."""
        if self._starting(r):
            assert r.started_at is not None and r.heartbeat is not None
            return self.settings.cold_seconds + (r.started_at - r.heartbeat)
        return self.threshold(r.key[0])

    def thresholds(self) -> dict[RankKey, float]:
        """Per running rank of the last scan: the heartbeat age (s) at which it is hung."""
        return {key: self._limit(r) for key, r in self._current.items() if r.alive}

    def lateness(self, now: float) -> dict[RankKey, float]:
        """Per running rank of a warm job: heartbeat age in units of the job's median step."""
        medians = self.step_medians()
        out = {}
        for key, r in self._current.items():
            median = medians.get(key[0])
            if r.alive and r.heartbeat is not None and median and not self._starting(r):
                out[key] = max(0.0, now - r.heartbeat) / median
        return out

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
        self._restarts(current)
        for r in current:
            self._step_time(r)
        self._current = {r.key: r for r in current}
        seen = set(self._current)
        for r in current:
            assert r.heartbeat is not None
            age = now - r.heartbeat
            limit = self._limit(r)
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
                    "step": r.step,
                }
                if r.phase is not None:
                    details.update(phase=r.phase, phase_deadline=r.paused_until)
                out.append(Transition(HANG, r.key, details))
        for key in list(self._hung):
            if key not in seen:  # the rank and its heartbeat are gone
                del self._hung[key]
                out.append(Transition(HANG_CLEARED, key, {"reason": "forgotten", "step": None}))
        return out

    def _restarts(self, current: list[RankProgress]) -> None:
        """A rank with a new process (restart, elastic resize): its job warms up again."""
        for r in current:
            if r.started_at is None or not r.alive:
                continue
            before = self._started.get(r.key)
            self._started[r.key] = r.started_at
            if before is not None and before != r.started_at:
                self._job(r.key[0]).reset()
                self._last.pop(r.key, None)

    def _step_time(self, r: RankProgress) -> None:
        """Note one step time of ``r``'s job when its step and step heartbeat advanced."""
        beat = r.step_heartbeat if r.step_heartbeat is not None else r.heartbeat
        if beat is None:
            return
        previous = self._last.get(r.key)
        if previous is not None and beat > previous[0]:
            stepped = None if r.step is None or previous[1] is None else r.step - previous[1]
            if stepped is not None and stepped > 0:
                self._job(r.key[0]).add((beat - previous[0]) / stepped)
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
    "MAD_TO_SIGMA",
    "STRAGGLER",
    "STRAGGLER_CLEARED",
    "HangDetector",
    "HangSettings",
    "RankProgress",
    "StepSample",
    "StepStats",
    "StragglerDetector",
    "StragglerSettings",
    "Transition",
    "collective_lag",
]
