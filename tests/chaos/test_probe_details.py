"""A probe's detail line reads as words: the value seen and the one wanted (Prometheus and
``ranks`` probes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from stormwatch.chaos import AttachedJobs
from stormwatch.chaos.execution.probes import ProbeContext, check
from stormwatch.chaos.experiment.providers import PrometheusProvider, RanksProvider, Tolerance
from stormwatch.clients import Sample
from stormwatch.contracts.journal import JobRef
from stormwatch.platforms.endpoints import AgentEndpoint


class StandInPrometheus:
    """Answers every instant query with the same values, one sample each."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    async def query(self, expr: str, *, at: float | None = None) -> list[Sample]:
        return [Sample({"rank": str(i)}, v, 0.0) for i, v in enumerate(self.values)]


def test_a_tolerance_is_printed_as_written_not_rounded() -> None:
    """Breaker's finding: ``eq: 4.0000001`` read "wanted == 4" beside a value of 4."""
    assert Tolerance(eq=4).describe() == "== 4"
    assert Tolerance(eq=4.0000001).describe() == "== 4.0000001"
    assert Tolerance(range=[0.1234561, 0.1234569]).describe() == "in [0.1234561, 0.1234569]"
    assert Tolerance(gt=1e16).describe() == "> 1e+16"


@pytest.mark.parametrize(
    ("values", "ok", "detail"),
    [
        ([2.0], False, "value 2, wanted == 4"),
        ([4.0], True, "4 (wanted == 4)"),
        ([4.0, 3.0], False, "values 4, 3, wanted each == 4"),
        ([4.0, 4.0], True, "4, 4 (wanted each == 4)"),
        ([4.0] * 7, True, "4, 4, 4, 4, 4, 4, … (wanted each == 4)"),
        # More than the six shown: those that failed are among them, first.
        ([4.0] * 6 + [3.0, 5.0], False, "values 3, 5, 4, 4, 4, 4, …, wanted each == 4"),
        ([], False, "no data (wanted == 4)"),
        # Six digits would read "value 4, wanted == 4" (breaker's finding, stop 37).
        ([3.9999999], False, "value 3.9999999, wanted == 4"),
        ([4.000000000001], False, "value 4.000000000001, wanted == 4"),
        ([1234567.8, 4.0], False, "values 1.23457e+06, 4, wanted each == 4"),
    ],
)
def test_the_prometheus_probe_says_what_it_saw_and_what_it_wanted(
    tmp_path: Path, values: list[float], ok: bool, detail: str
) -> None:
    ctx = ProbeContext(
        job=JobRef(name="j", log_dir=tmp_path, world_size=4, started_by_runner=False),
        jobs=AttachedJobs(tmp_path, world_size=4),
        prometheus=StandInPrometheus(values),  # type: ignore[arg-type]
        variables={"job": "j"},
    )
    provider = PrometheusProvider(type="prometheus", query="up", tolerance=Tolerance(eq=4))

    outcome = asyncio.run(check(provider, ctx))

    assert (outcome.ok, outcome.detail) == (ok, detail)
    assert isinstance(outcome.output, dict) and outcome.output["tolerance"] == "== 4"


async def _ranks_probe(tmp_path: Path, alive: int) -> tuple[bool, str]:
    """The ``ranks`` probe (want 4) against one agent that reports ``alive`` live ranks."""

    async def ranks(request: web.Request) -> web.Response:
        return web.json_response({"ranks": [{"job": "j", "rank": r} for r in range(alive)]})

    app = web.Application()
    app.router.add_get("/v1/ranks", ranks)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            ctx = ProbeContext(
                job=JobRef(name="j", log_dir=tmp_path, world_size=4, started_by_runner=False),
                jobs=AttachedJobs(tmp_path, world_size=4),
                prometheus=None,
                variables={"job": "j"},
                agents=(AgentEndpoint(node="node0", url=f"http://127.0.0.1:{port}"),),
                session=session,
            )
            provider = RanksProvider(type="ranks", tolerance=Tolerance(eq=4))
            outcome = await check(provider, ctx)
    finally:
        await runner.cleanup()
    return outcome.ok, outcome.detail


def test_the_ranks_probe_says_how_many_ranks_are_alive_and_how_many_it_wanted(
    tmp_path: Path,
) -> None:
    assert asyncio.run(_ranks_probe(tmp_path, 2)) == (False, "2 ranks alive, wanted == 4")
    assert asyncio.run(_ranks_probe(tmp_path, 4)) == (True, "4 ranks alive (wanted == 4)")
