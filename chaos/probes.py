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
from stormwatch.chaos.ranklogs import read_job_logs
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


def _job(provider: JobProvider, ctx: ProbeContext) -> ProbeOutcome:
    logs = read_job_logs(ctx.job.log_dir)
    now = ctx.clock()
    ended = ctx.jobs.exited(ctx.job.name)
    ranks: dict[str, JsonValue] = {}
    lagging: list[str] = []
    for rank in range(ctx.job.world_size):
        log = logs.get(rank)
        last = log.last_step if log is not None else None
        finished = log is not None and log.finished
        ranks[str(rank)] = {
            "last_step": last.step if last else None,
            "age_seconds": round(now - last.time, 3) if last else None,
            "attempt": log.latest_attempt if log is not None else None,
            "finished": finished,
        }
        if provider.expect == "finished":
            if not finished:
                lagging.append(f"rank {rank} not done (step {last.step if last else '-'})")
            continue
        if finished:
            continue
        floor = now - provider.window_seconds
        if ctx.since is not None:
            floor = max(floor, ctx.since)
        if last is None:
            lagging.append(f"rank {rank} has not stepped yet")
        elif last.time < floor:
            lagging.append(
                f"rank {rank} last stepped {now - last.time:.1f} s ago (step {last.step})"
            )
    output: JsonValue = {"expect": provider.expect, "job_ended": ended, "ranks": ranks}
    if not lagging:
        word = "finished" if provider.expect == "finished" else "progressing"
        return ProbeOutcome(True, f"all {ctx.job.world_size} ranks {word}", output)
    detail = "; ".join(lagging[:4]) + (f"; +{len(lagging) - 4} more" if len(lagging) > 4 else "")
    if ended is False:
        return ProbeOutcome(False, f"the job failed: {detail}", output, terminal=True)
    if ended is True:
        return ProbeOutcome(False, f"the job ended: {detail}", output, terminal=True)
    return ProbeOutcome(False, detail, output)


__all__ = ["ProbeContext", "ProbeOutcome", "check", "wait_for"]
