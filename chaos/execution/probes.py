"""Evaluate probe providers: a Prometheus query against a tolerance, or a job condition.

:func:`check` evaluates once; :func:`wait_for` polls until the condition holds,
cannot hold any more (the job failed), or the timeout passes. Neither raises
for a condition that does not hold or a service that does not answer: that is
the probe's *result* (:class:`ProbeOutcome`), recorded in the journal.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from pydantic import JsonValue

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import ServiceError
from stormwatch.chaos.experiment.model import (
    HttpProvider,
    JobProvider,
    LossProvider,
    ProgressProvider,
    PrometheusProvider,
    Provider,
    RanksProvider,
    expand,
)
from stormwatch.chaos.target import JobControl
from stormwatch.clients import AsyncPrometheusClient, PrometheusAPIError
from stormwatch.contracts.journal import JobRef
from stormwatch.platforms.endpoints import AgentEndpoint
from stormwatch.telemetry.ranklogs import current_world_size, read_job_logs


@dataclass(frozen=True)
class ProbeOutcome:
    """A probe's result.

    Attributes:
        ok: the condition held.
        detail: one line for humans (``4 (wanted == 4)``, ``value 2, wanted == 4``,
            ``ranks 0-3 at step 25, last step 3.1 s ago``).
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
        variables: placeholder values (``job``, ``steps``, ...; ``since_start`` is added at
            each evaluation from ``started_at``).
        started_at: Unix time the run started (``${since_start}``; None: ``${since_start}``
            is the time since this context was made).
        since: Unix time of the experiment's latest fault (None before any):
            ``progressing`` only counts steps completed after it.
        clock: Unix time source.
        agents: the node agents (``ranks`` probes).
        session: HTTP session (``http`` and ``ranks`` probes; None: they fail).
    """

    job: JobRef
    jobs: JobControl
    prometheus: AsyncPrometheusClient | None
    variables: dict[str, str]
    started_at: float | None = None
    since: float | None = None
    clock: Callable[[], float] = field(default=time.time)
    agents: tuple[AgentEndpoint, ...] = ()
    session: aiohttp.ClientSession | None = None


def variables_now(ctx: ProbeContext) -> dict[str, str]:
    """``ctx.variables`` and ``since_start``: whole seconds since ``ctx.started_at`` (at
    least 1, rounded up), as a PromQL duration (``95s``)."""
    started = ctx.clock() if ctx.started_at is None else ctx.started_at
    seconds = max(1, math.ceil(ctx.clock() - started))
    return {**ctx.variables, "since_start": f"{seconds}s"}


async def check(provider: Provider, ctx: ProbeContext) -> ProbeOutcome:
    """Evaluate ``provider`` once."""
    if isinstance(provider, PrometheusProvider):
        return await _prometheus(provider, ctx)
    if isinstance(provider, HttpProvider):
        return await _http(provider, ctx)
    if isinstance(provider, RanksProvider):
        return await _ranks(provider, ctx)
    if isinstance(provider, ProgressProvider):
        return _progress(provider, ctx)
    if isinstance(provider, LossProvider):
        return _loss(provider, ctx)
    return _job(provider, ctx)


async def _http(provider: HttpProvider, ctx: ProbeContext) -> ProbeOutcome:
    url = expand(provider.url, variables_now(ctx))
    if ctx.session is None:
        return ProbeOutcome(False, "no HTTP session", {"url": url}, terminal=True)
    try:
        async with ctx.session.get(
            url, timeout=aiohttp.ClientTimeout(total=provider.timeout_seconds)
        ) as response:
            body = await response.text(errors="replace")
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        detail = f"GET {url}: {type(exc).__name__}: {exc}"
        return ProbeOutcome(False, detail, {"url": url, "error": detail})
    output: JsonValue = {"url": url, "status": status, "body_bytes": len(body)}
    if status != provider.status:
        return ProbeOutcome(False, f"GET {url}: HTTP {status}, wanted {provider.status}", output)
    if provider.contains is not None and provider.contains not in body:
        return ProbeOutcome(False, f"GET {url}: body lacks {provider.contains!r}", output)
    return ProbeOutcome(True, f"GET {url}: HTTP {status}", output)


async def _ranks(provider: RanksProvider, ctx: ProbeContext) -> ProbeOutcome:
    tolerance = provider.tolerance.describe()
    if ctx.session is None or not ctx.agents:
        return ProbeOutcome(False, "no node agents in this target", None, terminal=True)
    client = AgentClient(ctx.session)
    alive: list[int] = []
    errors: list[str] = []
    for agent in ctx.agents:
        try:
            ranks = await client.ranks(agent.url)
        except ServiceError as exc:
            errors.append(f"{agent.node}: {exc}")
            continue
        alive += [r.rank for r in ranks if r.job == ctx.job.name and r.alive]
    count = len(set(alive))
    alive_ranks: list[JsonValue] = list(sorted(set(alive)))
    output: JsonValue = {"alive_ranks": alive_ranks, "errors": list(errors)}
    if errors:
        return ProbeOutcome(False, "agents did not answer: " + "; ".join(errors), output)
    if not provider.tolerance.accepts(float(count)):
        return ProbeOutcome(False, f"{count} ranks alive, wanted {tolerance}", output)
    return ProbeOutcome(True, f"{count} ranks alive (wanted {tolerance})", output)


def _progress(provider: ProgressProvider, ctx: ProbeContext) -> ProbeOutcome:
    logs = read_job_logs(ctx.job.log_dir)
    floor = ctx.clock() - provider.window_seconds
    slow: list[str] = []
    counts: dict[str, JsonValue] = {}
    for rank in range(current_world_size(logs, ctx.job.world_size)):
        log = logs.get(rank)
        if log is not None and log.finished:
            counts[str(rank)] = "finished"
            continue
        recent = {e.step for e in (log.steps if log else []) if e.time >= floor}
        counts[str(rank)] = len(recent)
        if len(recent) < provider.min_steps:
            slow.append(f"rank {rank}: {len(recent)}")
    output: JsonValue = {"steps_in_window": counts, "window_seconds": provider.window_seconds}
    if slow:
        detail = f"fewer than {provider.min_steps} step(s) in {provider.window_seconds:g} s: "
        return ProbeOutcome(False, detail + ", ".join(slow), output)
    return ProbeOutcome(
        True, f"every rank made >= {provider.min_steps} step(s) in the window", output
    )


def _loss(provider: LossProvider, ctx: ProbeContext) -> ProbeOutcome:
    log = read_job_logs(ctx.job.log_dir).get(0)
    losses = [e.loss for e in (log.steps if log else []) if e.loss is not None]
    if not losses:
        return ProbeOutcome(False, "no loss logged yet by rank 0", None)
    last, lowest = losses[-1], min(losses)
    output: JsonValue = {"last": last, "lowest": lowest, "steps": len(losses)}
    if not math.isfinite(last):
        return ProbeOutcome(False, f"loss is {last}", output, terminal=True)
    if provider.max is not None and last > provider.max:
        return ProbeOutcome(False, f"loss {last:.4g} > max {provider.max:g}", output)
    if last > provider.max_ratio * lowest:
        return ProbeOutcome(
            False, f"loss {last:.4g} > {provider.max_ratio:g} x lowest {lowest:.4g}", output
        )
    return ProbeOutcome(True, f"loss {last:.4g} finite and sane", output)


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
    query = expand(provider.query, variables_now(ctx))
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
    listed = samples
    if len(samples) > 6 and bad:  # not all are shown: the values that failed come first
        failed = {id(s) for s in bad}
        listed = bad + [s for s in samples if id(s) not in failed]
    accepts = provider.tolerance.accepts
    shown = ", ".join(_shown(s.value, accepts) for s in listed[:6])
    shown += ", …" if len(samples) > 6 else ""
    wanted = tolerance if len(samples) == 1 else f"each {tolerance}"
    if bad:
        what = "value" if len(samples) == 1 else "values"
        return ProbeOutcome(False, f"{what} {shown}, wanted {wanted}", output)
    return ProbeOutcome(True, f"{shown} (wanted {wanted})", output)


def _shown(value: float, accepts: Callable[[float], bool]) -> str:
    """``value`` in six significant digits, or as many more as it takes for the text to pass
    or fail the tolerance as the value does (3.9999999 failing ``== 4`` read "value 4")."""
    for digits in (6, 9, 12):
        text = f"{value:.{digits}g}"
        if accepts(float(text)) == accepts(value):
            return text
    return repr(value)


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


def _job(provider: JobProvider, ctx: ProbeContext) -> ProbeOutcome:
    logs = read_job_logs(ctx.job.log_dir)
    now = ctx.clock()
    ended = ctx.jobs.exited(ctx.job.name)
    ranks: dict[str, JsonValue] = {}
    lagging: dict[str, list[tuple[int, int | None, float | None]]] = {}
    world = current_world_size(logs, ctx.job.world_size)
    for rank in range(world):
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
        if finished and (ctx.since is None or (log is not None and log.done_at > ctx.since)):
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
        return ProbeOutcome(True, f"all {world} ranks {word}", output)
    detail = "; ".join(_describe(kind, entries) for kind, entries in lagging.items())
    if ended is False:
        return ProbeOutcome(False, f"the job failed: {detail}", output, terminal=True)
    if ended is True:
        return ProbeOutcome(False, f"the job ended: {detail}", output, terminal=True)
    return ProbeOutcome(False, detail, output)


__all__ = ["ProbeContext", "ProbeOutcome", "check", "wait_for"]
