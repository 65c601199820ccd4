"""HTTP readiness checks of the lab's services (aiohttp).

:func:`wait_healthy` polls every service's health URL concurrently until all
answer 2xx; it fails fast, naming the service and its log file, when a service
exits, and fails after the timeout with the last error it saw.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from stormwatch.clients import PrometheusAPIError, PrometheusClient
from stormwatch.lab.errors import ServiceFailedError
from stormwatch.lab.services import procs
from stormwatch.lab.state import LabState, ProcessRecord

#: Seconds between two probes of a service that is not ready yet.
POLL_INTERVAL = 0.2
#: Seconds one probe may take (a ready service answers in milliseconds).
PROBE_TIMEOUT = 2.0


@dataclass(frozen=True)
class HealthCheck:
    """Probe ``url`` of the service run by ``process``."""

    process: ProcessRecord
    url: str


@dataclass(frozen=True)
class Health:
    """The outcome of one probe: ``detail`` is the status line or the error."""

    ok: bool
    detail: str


async def probe(session: aiohttp.ClientSession, url: str) -> Health:
    """GET ``url`` once."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT)) as resp:
            await resp.read()
            return Health(200 <= resp.status < 300, f"HTTP {resp.status}")
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return Health(False, f"{type(exc).__name__}: {exc}".rstrip(": "))


def _failure(check: HealthCheck, what: str) -> ServiceFailedError:
    record = check.process
    tail = procs.log_tail(record.log_file)
    message = f"{record.name} {what}; see its log {record.log_file}"
    if tail:
        message += "\nlast lines of the log:\n" + tail
    return ServiceFailedError(message, service=record.name, log_file=record.log_file)


async def _wait_one(
    session: aiohttp.ClientSession,
    check: HealthCheck,
    deadline: float,
    on_ready: Callable[[str], None] | None,
) -> None:
    started = time.monotonic()
    last = Health(False, "not probed yet")
    while True:
        last = await probe(session, check.url)
        if last.ok:
            if on_ready is not None:
                on_ready(check.process.name)
            return
        status = procs.exit_status(check.process)
        if status.returncode is not None or procs.is_finished(check.process):
            code = status.returncode
            how = f"exited with code {code}" if code is not None else "exited"
            raise _failure(check, f"{how} before becoming healthy")
        if time.monotonic() >= deadline:
            waited = time.monotonic() - started
            raise _failure(
                check,
                f"did not become healthy within {waited:.0f} s (GET {check.url}: {last.detail})",
            )
        await asyncio.sleep(POLL_INTERVAL)


async def _wait_all(
    checks: Sequence[HealthCheck], timeout: float, on_ready: Callable[[str], None] | None
) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(_wait_one(session, c, deadline, on_ready)) for c in checks]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def wait_healthy(
    checks: Sequence[HealthCheck],
    *,
    timeout: float,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Block until every check passes; ``on_ready(name)`` is called as each one does.

    Raises:
        ServiceFailedError: a service exited or stayed unhealthy for ``timeout``
            seconds (the first such service; the message names its log file and
            quotes its last lines).
    """
    asyncio.run(_wait_all(checks, timeout, on_ready))


def check_urls(urls: dict[str, str]) -> dict[str, Health]:
    """Probe each named URL once, concurrently (for ``lab status``)."""

    async def run() -> dict[str, Health]:
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(*(probe(session, url) for url in urls.values()))
        return dict(zip(urls, results, strict=True))

    return asyncio.run(run()) if urls else {}


def wait_scraped(state: LabState, deadline: float) -> None:
    """Wait until Prometheus reports every agent target up (``deadline``: time.monotonic()).

    Raises:
        ServiceFailedError: an agent is still not scraped at ``deadline`` (names the
            node, Prometheus' last scrape error and the agent's log file).
    """
    client = PrometheusClient(state.prometheus_url, timeout=2.0)
    wanted = {node.name for node in state.nodes}
    while True:
        try:
            targets = client.targets()
            down = {}
            for target in targets:
                node = target.labels.get("node")
                if node in wanted and target.health != "up":
                    down[node] = target.last_error or target.health
            seen = {t.labels.get("node") for t in targets}
            down.update({n: "not a target" for n in wanted - seen})
            if not down:
                return
            node, detail = next(iter(sorted(down.items())))
        except PrometheusAPIError as exc:
            node, detail = "?", str(exc)
        if time.monotonic() >= deadline:
            record = state.processes.get(f"agent-{node}") or state.processes["prometheus"]
            raise ServiceFailedError(
                f"Prometheus cannot scrape the agent of {node}: {detail}; see {record.log_file}",
                service=record.name,
                log_file=record.log_file,
            )
        time.sleep(0.5)


__all__ = ["Health", "HealthCheck", "check_urls", "probe", "wait_healthy", "wait_scraped"]
