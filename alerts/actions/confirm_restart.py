"""``confirm_restart``: wait until torchrun has restarted the job and every rank progresses.

The action for :data:`StormwatchRankStalled`: after a rank died, torchrun
should restart the worker group. The action polls Prometheus until

* the job's attempt ``stormwatch_train_job_restarts`` (restarts of the whole job, agreed
  by every rank at start-up: :mod:`stormwatch.telemetry.restarts`) is above its value
  before the incident. Not torchrun's ``TORCHELASTIC_RESTART_COUNT``
  (``stormwatch_train_node_restarts``): that is per node, and a node restarted only
  because a peer failed does not count it, so its max can stay where it was after a
  restart. Each node's own count is reported beside the job's (before and after), and
* every rank of the job (``0 .. stormwatch_train_world_size - 1``, or every rank
  with a heartbeat when the world size is unknown) has a
  ``stormwatch_rank_last_progress_timestamp_seconds`` later than the incident's
  ``starts_at`` (its first alert's ``startsAt``): it made progress after the failure,

and then succeeds; it fails after a timeout. It only reads, so it is retry-safe.
It runs once per incident, that is once per alert group episode: one dead rank
whose siblings torchrun stops as well gives one confirmation, not one per rank.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from stormwatch.alerts.actions.base import Action, ActionOutcome
from stormwatch.clients import AsyncPrometheusAPI, PrometheusAPIError, promql_string
from stormwatch.contracts.labels import TRAINING_JOB_LABEL
from stormwatch.contracts.responder import IncidentRecord
from stormwatch.errors import ConfigError

#: The job's attempt, agreed by every rank (job-wide), and each node's own count.
JOB_ATTEMPT = "stormwatch_train_job_restarts"
NODE_RESTARTS = "stormwatch_train_node_restarts"


@dataclass(frozen=True, kw_only=True)
class ConfirmRestartSettings:
    """Timing of :class:`ConfirmRestart`.

    Attributes:
        timeout_s: give up (``failed``) after this many seconds. Default 300 s:
            a torchrun restart in the lab (teardown, rendezvous, imports,
            checkpoint load) takes 10-60 s on a loaded 2-core machine.
        poll_interval_s: seconds between polls. Default 2 s (2 scrape intervals
            of the lab's 1 s scrape).
        baseline_offset_s: the restart count "before" is read this many seconds
            before the incident's ``starts_at``. Default 5 s: the alert fires at most
            ~3 s after a rank exits (1 s agent sampling + 1 s scrape + 1 s rule
            evaluation), and the next attempt's workers need longer than that to
            start, so the value 5 s earlier belongs to the attempt that failed.
    """

    timeout_s: float = 300.0
    poll_interval_s: float = 2.0
    baseline_offset_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("timeout_s", "poll_interval_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"confirm_restart.{name}: must be > 0 seconds (got {value!r})")
        if not self.baseline_offset_s >= 0:
            raise ConfigError(
                f"confirm_restart.baseline_offset_s: must be >= 0 (got {self.baseline_offset_s!r})"
            )


@dataclass
class _Observation:
    restart_before: float | None = None
    baseline_known: bool = False
    restart_now: float | None = None
    nodes_before: dict[str, float] = field(default_factory=dict)
    nodes_now: dict[str, float] = field(default_factory=dict)
    world_size: int | None = None
    progressed: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def restarted(self) -> bool:
        if self.restart_now is None or not self.baseline_known:
            return False
        return self.restart_before is None or self.restart_now > self.restart_before

    @property
    def confirmed(self) -> bool:
        return self.restarted and bool(self.progressed) and not self.waiting

    def data(self) -> dict[str, object]:
        return {
            "restart_count_before": self.restart_before,
            "restart_count_after": self.restart_now,
            "node_restarts_before": dict(self.nodes_before),
            "node_restarts_after": dict(self.nodes_now),
            "world_size": self.world_size,
            "ranks_progressed": list(self.progressed),
            "ranks_waiting": list(self.waiting),
        }


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)


class ConfirmRestart(Action):
    """Poll Prometheus until the job restarted and all its ranks progress again.

    Args:
        prometheus: the Prometheus API, or None when the responder has no
            ``--prometheus-url`` (the action is then skipped by its guard).
        settings: timing; see :class:`ConfirmRestartSettings`.
        clock: Unix time source (seconds), for the timeout and timestamps.
        sleep: awaitable sleep, for the poll interval.
    """

    kind = "confirm_restart"
    retry_safe = True

    def __init__(
        self,
        prometheus: AsyncPrometheusAPI | None,
        settings: ConfirmRestartSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._prometheus = prometheus
        self.settings = settings or ConfirmRestartSettings()
        self._clock = clock
        self._sleep = sleep

    def guard(self, incident: IncidentRecord) -> str | None:
        """Skip without a Prometheus URL, or when the incident's alerts share no
        ``training_job`` label."""
        if self._prometheus is None:
            return "no Prometheus URL configured (stormwatch alerts serve --prometheus-url)"
        if not incident.labels.get(TRAINING_JOB_LABEL):
            return (
                f"the incident's alerts share no '{TRAINING_JOB_LABEL}' label, so there is no "
                "job to watch"
            )
        return None

    async def run(self, incident: IncidentRecord) -> ActionOutcome:
        """Poll until confirmed (``succeeded``) or ``settings.timeout_s`` passed (``failed``)."""
        job = incident.labels[TRAINING_JOB_LABEL]
        deadline = self._clock() + self.settings.timeout_s
        seen = _Observation()
        polls = 0
        while True:
            polls += 1
            seen = await self._observe(job, incident.starts_at, seen)
            now = self._clock()
            if seen.confirmed:
                return ActionOutcome(
                    status="succeeded",
                    detail=(
                        f"job {job} restarted (restart count {_fmt(seen.restart_before)} -> "
                        f"{_fmt(seen.restart_now)} for the job; {_nodes(seen)}) and all "
                        f"{len(seen.progressed)} ranks made progress after the alert started"
                    ),
                    data={**seen.data(), "confirmed_at": now, "polls": polls},
                )
            if now >= deadline:
                waiting = ", ".join(seen.waiting) or "none known"
                detail = (
                    f"not confirmed within {self.settings.timeout_s:g} s: restart count "
                    f"{_fmt(seen.restart_before)} -> {_fmt(seen.restart_now)} "
                    f"({'increased' if seen.restarted else 'not increased'}) for the job; "
                    f"{_nodes(seen)}; "
                    f"ranks without progress since the alert: {waiting}"
                )
                if seen.error:
                    detail += f"; last Prometheus error: {seen.error}"
                return ActionOutcome(
                    status="failed",
                    detail=detail,
                    data={**seen.data(), "polls": polls, "error": seen.error},
                )
            await self._sleep(min(self.settings.poll_interval_s, max(deadline - now, 0.0)))

    async def _observe(self, job: str, since: float, previous: _Observation) -> _Observation:
        assert self._prometheus is not None  # guarded
        prom = self._prometheus
        selector = f"{{{TRAINING_JOB_LABEL}={promql_string(job)}}}"
        seen = _Observation(
            restart_before=previous.restart_before,
            baseline_known=previous.baseline_known,
            nodes_before=previous.nodes_before,
        )
        try:
            if not seen.baseline_known:
                at = since - self.settings.baseline_offset_s
                before, nodes = await asyncio.gather(
                    prom.query(f"max(max_over_time({JOB_ATTEMPT}{selector}[60s]))", at=at),
                    prom.query(
                        f"max by (node) (max_over_time({NODE_RESTARTS}{selector}[60s]))", at=at
                    ),
                )
                seen.restart_before = before[0].value if before else None
                seen.nodes_before = {s.labels.get("node", ""): s.value for s in nodes}
                seen.baseline_known = True
            restart, nodes_now, world, progress = await asyncio.gather(
                prom.query(f"max({JOB_ATTEMPT}{selector})"),
                prom.query(f"max by (node) ({NODE_RESTARTS}{selector})"),
                prom.query(f"max(stormwatch_train_world_size{selector})"),
                prom.query(
                    f"max by (rank) (stormwatch_rank_last_progress_timestamp_seconds{selector})"
                ),
            )
        except PrometheusAPIError as exc:
            seen.error = str(exc)
            return seen
        seen.restart_now = restart[0].value if restart else None
        seen.nodes_now = {s.labels.get("node", ""): s.value for s in nodes_now}
        seen.world_size = int(world[0].value) if world and world[0].value >= 1 else None
        last = {s.labels.get("rank", ""): s.value for s in progress}
        expected = (
            [str(r) for r in range(seen.world_size)]
            if seen.world_size is not None
            else sorted(last, key=_rank_order)
        )
        for rank in expected:
            (seen.progressed if last.get(rank, float("-inf")) > since else seen.waiting).append(
                rank
            )
        return seen


def _nodes(seen: _Observation) -> str:
    """Each node's own (torchrun) restart count, before -> now: ``node restarts node0 1 -> 1,
    node1 0 -> 1``."""
    names = sorted(set(seen.nodes_before) | set(seen.nodes_now))
    if not names:
        return "node restarts unknown"
    shown = ", ".join(
        f"{name or '?'} {_fmt(seen.nodes_before.get(name))} -> {_fmt(seen.nodes_now.get(name))}"
        for name in names
    )
    return f"node restarts {shown}"


def _fmt(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"{value:g}"


__all__ = ["ConfirmRestart", "ConfirmRestartSettings"]
