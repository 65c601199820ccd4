"""Evaluate probe providers: a Prometheus query against a tolerance, or a job condition.

:func:`check` evaluates once; :func:`wait_for` polls until the condition holds,
cannot hold any more (the job failed), or the timeout passes. Neither raises
for a condition that does not hold or a service that does not answer: that is
the probe's *result* (:class:`ProbeOutcome`), recorded in the journal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import JsonValue

from stormwatch.chaos.experiment import JobProvider, PrometheusProvider, Provider, expand
from stormwatch.chaos.journal import JobRef
from stormwatch.chaos.lab import AsyncPrometheusClient, PrometheusAPIError
from stormwatch.chaos.ranklogs import RankLog, read_job_logs
from stormwatch.chaos.target import JobControl


@dataclass(frozen=True)
class ProbeOutcome:
    """A probe's result.

    Attributes:
        ok: the condition held.
        detail: one line for humans (``4 == 4``, ``rank 1 last stepped 12.3 s ago``).
        output: what was observed, for the journal.
        terminal: the condition can no longer hold (e.g. the job failed): stop waiting.
    """

    ok: bool
    detail: str
    output: JsonValue = None
    terminal: bool = False


@dataclass(frozen=True, kw_only=True)
class ProbeContext:
    """What probes read.

    Attributes:
        job: the job under test.
        jobs: to ask whether it ended.
        prometheus: None when the target has no Prometheus.
        variables: placeholder values (``job``, ``steps``, ...).
        since: Unix time of the experiment's latest fault (None before any):
            ``progressing`` only counts steps completed after it.
        clock: Unix time source.
    """

    job: JobRef
    jobs: JobControl
    prometheus: AsyncPrometheusClient | None
    variables: dict[str, str]
    since: float | None = None
    clock: Callable[[], float] = field(default=time.time)


async def check(provider: Provider, ctx: ProbeContext) -> ProbeOutcome:
    """Evaluate ``provider`` once."""
    if isinstance(provider, PrometheusProvider):
        return await _prometheus(provider, ctx)
    return _job(provider, ctx)


async def wait_for(
    provider: Provider,
    ctx: ProbeContext,
    *,
    timeout: float,
    poll: float,
    on_poll: Callable[[ProbeOutcome, float], None] | None = None,
) -> ProbeOutcome:
    """Poll every ``poll`` seconds until ``provider`` holds, turns terminal, or ``timeout`` passes.

    ``timeout`` 0 means one check. ``on_poll(outcome, elapsed)`` is called after each
    failed check (progress display). Returns the last outcome.
    """
    start = time.monotonic()
    while True:
        outcome = await check(provider, ctx)
        elapsed = time.monotonic() - start
        if outcome.ok or outcome.terminal or elapsed + poll > timeout:
            if not outcome.ok and timeout > 0 and not outcome.terminal:
                return ProbeOutcome(
                    False, f"{outcome.detail} (still after {elapsed:.0f} s)", outcome.output
                )
            return outcome
        if on_poll is not None:
            on_poll(outcome, elapsed)
        await asyncio.sleep(poll)


async def _prometheus(provider: PrometheusProvider, ctx: ProbeContext) -> ProbeOutcome:
    query = expand(provider.query, ctx.variables)
    tolerance = provider.tolerance.describe()
    if ctx.prometheus is None:
        return ProbeOutcome(False, "no Prometheus in this target", {"query": query}, terminal=True)
    try:
        samples = await ctx.prometheus.query(query)
    except PrometheusAPIError as exc:
        return ProbeOutcome(False, str(exc), {"query": query, "error": str(exc)})
    values: list[JsonValue] = [{"labels": dict(s.labels), "value": s.value} for s in samples]
    output: JsonValue = {"query": query, "tolerance": tolerance, "result": values}
    if not samples:
        return ProbeOutcome(False, f"no data (wanted {tolerance})", output)
    bad = [s for s in samples if not provider.tolerance.accepts(s.value)]
    shown = ", ".join(f"{s.value:g}" for s in samples[:6])
    if bad:
        return ProbeOutcome(False, f"{shown} not {tolerance}", output)
    return ProbeOutcome(True, f"{shown} {tolerance}", output)


def rank_spans(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``ranks 0-3, 5``; one rank -> ``rank 1``."""
    spans: list[str] = []
    ordered = sorted(ranks)
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(spans)


def _steps(entries: list[tuple[int, int | None, float | None]]) -> str:
    steps = sorted({step for _, step, _ in entries if step is not None})
    if not steps:
        return "no step"
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def _describe(kind: str, entries: list[tuple[int, int | None, float | None]]) -> str:
    """One short phrase for ranks in the same situation (fits a progress line)."""
    who = rank_spans([rank for rank, _, _ in entries])
    if kind == "not stepped yet":
        return f"{who} not stepped yet"
    if kind == "not done":
        return f"{who} not done (at {_steps(entries)})"
    if kind == "finished before the fault":
        return f"{who} had finished before the fault (at {_steps(entries)})"
    ages = [age for _, _, age in entries if age is not None]
    return f"{who} at {_steps(entries)}, last step {min(ages):.1f} s ago"


def _done_at(log: RankLog | None) -> float:
    """Unix time of the rank's last ``done`` event (0 when it has none)."""
    if log is None:
        return 0.0
    return max((e.time for e in log.events if e.event == "done"), default=0.0)


def _job(provider: JobProvider, ctx: ProbeContext) -> ProbeOutcome:
    logs = read_job_logs(ctx.job.log_dir)
    now = ctx.clock()
    ended = ctx.jobs.exited(ctx.job.name)
    ranks: dict[str, JsonValue] = {}
    lagging: dict[str, list[tuple[int, int | None, float | None]]] = {}
    for rank in range(ctx.job.world_size):
        log = logs.get(rank)
        last = log.last_step if log is not None else None
        finished = log is not None and log.finished
        step = last.step if last else None
        age = now - last.time if last else None
        ranks[str(rank)] = {
            "last_step": step,
            "age_seconds": round(age, 3) if age is not None else None,
            "attempt": log.latest_attempt if log is not None else None,
            "finished": finished,
        }
        if provider.expect == "finished":
            if not finished:
                lagging.setdefault("not done", []).append((rank, step, age))
            continue
        if finished and (ctx.since is None or _done_at(log) > ctx.since):
            continue
        floor = now - provider.window_seconds
        if ctx.since is not None:
            floor = max(floor, ctx.since)
        if finished:  # done before the latest fault: nothing stepped after it
            lagging.setdefault("finished before the fault", []).append((rank, step, age))
        elif last is None:
            lagging.setdefault("not stepped yet", []).append((rank, step, age))
        elif last.time < floor:
            lagging.setdefault("stale", []).append((rank, step, age))
    output: JsonValue = {"expect": provider.expect, "job_ended": ended, "ranks": ranks}
    if not lagging:
        word = "finished" if provider.expect == "finished" else "progressing"
        return ProbeOutcome(True, f"all {ctx.job.world_size} ranks {word}", output)
    detail = "; ".join(_describe(kind, entries) for kind, entries in lagging.items())
    if ended is False:
        return ProbeOutcome(False, f"the job failed: {detail}", output, terminal=True)
    if ended is True:
        return ProbeOutcome(False, f"the job ended: {detail}", output, terminal=True)
    return ProbeOutcome(False, detail, output)


__all__ = ["ProbeContext", "ProbeOutcome", "check", "wait_for"]
