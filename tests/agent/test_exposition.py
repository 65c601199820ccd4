"""Item 10: ``/metrics`` serves a cached exposition, rendered ahead of the scrapes.

The cache is driven with a manual monotonic clock and a real :class:`GpuSampler`
over the fake NVML; the agent-level test scrapes a real agent.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from stormwatch.agent import FakeNvml
from stormwatch.agent.exposition import ExpositionCache, LiveAges
from stormwatch.agent.gpu.sampler import GpuSampler


def _sampler() -> GpuSampler:
    fake = FakeNvml(1)
    fake.nvmlInit()
    sampler = GpuSampler(fake)
    sampler.sample()
    return sampler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cache(clock: Clock, sampler: GpuSampler | None = None) -> tuple[ExpositionCache, list[int]]:
    rendered: list[int] = []

    def render(openmetrics_format: bool) -> bytes:
        rendered.append(1)
        return b"# rendered %d\n" % len(rendered)

    cache = ExpositionCache(
        render, live=LiveAges(sampler, None), sampler=sampler, period=1.0, monotonic=clock
    )
    return cache, rendered


def test_a_fresh_cache_is_served_without_rendering() -> None:
    clock = Clock()
    sampler = _sampler()
    cache, rendered = _cache(clock, sampler)
    cache.refresh()
    clock.now += 0.5
    assert not cache.stale()
    assert cache.body().startswith(b"# rendered 1\n")
    assert b"stormwatch_gpu_snapshot_age_seconds" in cache.body(), "ages are live"
    assert len(rendered) == 1


def test_a_new_sample_an_invalidation_or_old_age_make_the_scrape_render() -> None:
    clock = Clock()
    sampler = _sampler()
    cache, rendered = _cache(clock, sampler)
    cache.refresh()
    sampler.sample()
    assert cache.stale(), "a snapshot the cache does not hold"
    assert cache.body().startswith(b"# rendered 2\n")
    cache.invalidate()
    assert cache.body().startswith(b"# rendered 3\n")
    clock.now += 2.5
    assert cache.body().startswith(b"# rendered 4\n"), "older than two periods"
    assert len(rendered) == 4


def test_background_renders_follow_the_scrapers() -> None:
    clock = Clock()
    cache, _ = _cache(clock)
    assert not cache.wanted(), "nobody scrapes: no renders"
    for _ in range(4):  # a scraper every 0.5 s (faster than the 1 s period)
        cache.body()
        clock.now += 0.5
    assert cache.wanted()
    clock.now += 10
    assert not cache.wanted(), "the scraper went away"


def test_a_slow_scraper_gets_one_render_just_before_its_next_scrape() -> None:
    clock = Clock()
    cache, _ = _cache(clock)
    for _ in range(4):  # Prometheus every 15 s, at a fixed phase
        cache.body()
        clock.now += 15
    last = clock.now - 15
    lead = cache.lead
    assert 0 < lead < 0.1
    early = [at for at in range(0, 139) if cache.wanted(last + at / 10)]
    assert not early, "nothing before the last period before the expected scrape"
    clock.now = last + 14.5  # the last GPU sample before the scrape came
    assert cache.wanted()
    cache.refresh()
    assert not cache.wanted(), "rendered: the scrape will be served this"
    clock.now = last + 20
    assert not cache.wanted()
    clock.now = last + 29.5  # before the next one: the cache is old by then
    assert cache.wanted()
    assert not cache.wanted(last + 46), "three intervals without a scrape"


def test_agent_scrapes_serve_the_sample_taken_just_before(start_agent: Any, tools: Any) -> None:
    fake = FakeNvml(1)
    agent = start_agent(fake)
    replays = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
    fake.gpus[0].counters["pcie_replay"] = 7
    agent.sample()
    assert tools.scrape(agent.url).value(replays, gpu="0") == 7
    fake.gpus[0].counters["pcie_replay"] = 8
    assert tools.scrape(agent.url).value(replays, gpu="0") == 7, "no new sample yet"
    agent.sample()
    assert tools.scrape(agent.url).value(replays, gpu="0") == 8


def test_the_background_does_not_render_again_what_a_scrape_just_rendered() -> None:
    clock = Clock()
    sampler = _sampler()
    cache, rendered = _cache(clock, sampler)
    cache.refresh()
    sampler.sample()
    cache.body()  # the scrape came between the sample and the background's render
    assert len(rendered) == 2
    assert not cache.refresh_if_behind(), "same snapshot, rendered just now"
    clock.now += 1.0
    assert cache.refresh_if_behind(), "a period old: rendered again (rank and trainer state)"
    sampler.sample()
    assert cache.refresh_if_behind(), "a new sample"
    cache.invalidate()
    assert cache.refresh_if_behind(), "a state change"
    assert len(rendered) == 5


def test_the_gzipped_body_is_one_gzip_stream_of_the_body_compressed_once_per_render() -> None:
    import gzip
    import zlib

    clock = Clock()
    cache, rendered = _cache(clock)  # no sampler: the live part is the render histogram
    for openmetrics in (False, True):
        assert cache.gzip_ready(openmetrics) is False
        served = cache.gzipped(openmetrics)
        assert gzip.decompress(served) == cache.body(openmetrics)
        stream = zlib.decompressobj(16 + zlib.MAX_WBITS)  # one member, nothing after it
        stream.decompress(served)
        assert stream.eof and stream.unused_data == b""
        assert served[:2] == b"\x1f\x8b"
    assert cache.body(True).endswith(b"# EOF\n")
    head = cache._gzipped[False][1]
    cache.gzipped(False)
    assert cache._gzipped[False][1] is head  # the cached part is not compressed again
    # A render compresses what scrapers asked gzipped, off the scrapes (the background's).
    clock.now += 5.0
    cache.refresh()
    assert cache.gzip_ready(False) and cache.gzip_ready(True)
    assert cache._gzipped[False][1] is not head
    assert gzip.decompress(cache.gzipped(False)) == cache.body(False)
    assert cache.body(False).startswith(b"# rendered %d\n" % (len(rendered) - 1))  # text first


def test_the_gzipped_body_carries_this_scrapes_live_ages() -> None:
    import gzip

    clock = Clock()
    sampler = _sampler()
    cache, _ = _cache(clock, sampler)
    cache.refresh()
    first = gzip.decompress(cache.gzipped(False))
    time.sleep(0.01)  # the snapshot's age, computed at each scrape, moves: only it
    second = gzip.decompress(cache.gzipped(False))
    assert first.startswith(b"# rendered 1\n") and second.startswith(b"# rendered 1\n")
    assert first != second and b"stormwatch_gpu_snapshot_age_seconds" in second


def _format_cache(
    clock: Clock, forgotten: list[bool] | None = None
) -> tuple[ExpositionCache, list[bool]]:
    """A cache without GPUs and the formats its renders were asked for, in order (and, in
    ``forgotten``, the formats it told the renderer to forget)."""
    formats: list[bool] = []

    def render(openmetrics_format: bool) -> bytes:
        formats.append(openmetrics_format)
        return b"# rendered\n"

    cache = ExpositionCache(
        render,
        live=LiveAges(None, None),
        sampler=None,
        period=1.0,
        monotonic=clock,
        forget=None if forgotten is None else forgotten.append,
    )
    return cache, formats


def test_only_the_formats_scrapers_asked_for_lately_are_rendered_ahead() -> None:
    from stormwatch.agent import exposition

    clock = Clock()
    forgotten: list[bool] = []
    cache, formats = _format_cache(clock, forgotten)
    cache.refresh()  # the agent's start: text, before any scrape
    assert formats == [False]
    cache.body(True)  # Prometheus negotiates OpenMetrics: that scrape renders it
    formats.clear()
    clock.now += 1.5
    assert cache.refresh_if_behind()
    assert formats == [True]  # no text body nobody reads
    assert forgotten == [False]  # and the renderer keeps nothing of it
    cache.body(False)  # someone curls the text format once
    clock.now += 1.5
    formats.clear()
    assert cache.refresh_if_behind()
    assert formats == [False, True]
    for _ in range(6):  # OpenMetrics every minute; the text format is not asked again
        clock.now += 60.0
        cache.body(True)
    formats.clear()
    clock.now += 1.5
    assert cache.refresh_if_behind()
    assert formats == [True]  # the text format lapsed after FORMAT_KEEP_SECONDS
    assert forgotten == [False, False]
    assert exposition.FORMAT_KEEP_SECONDS < 6 * 60.0


def test_a_scraper_slower_than_the_format_keep_time_keeps_its_format_rendered_ahead() -> None:
    # Breaker pass (stop 36): a scrape every 10 minutes outlived the 300 s keep time, so the
    # background rendered a text body nobody read and every scrape rendered itself.
    clock = Clock()
    cache, formats = _format_cache(clock)
    for _ in range(4):
        cache.body(True)
        clock.now += 600.0
    formats.clear()
    assert cache.refresh_if_behind()
    assert formats == [True]


@pytest.mark.parametrize(
    ("header", "wanted"),
    [
        ("gzip", True),
        ("GZIP;Q=0.5", True),
        ("x-gzip", True),
        ("br, gzip;q=0.001", True),
        ("gzip;q=abc", True),  # not a number: counts as 1
        ("gzip;q=nan", True),
        ("", False),
        ("identity", False),
        ("*", False),  # as prometheus-client: gzip must be named
        ("gzip;q=0", False),
        ("gzip;q=0.0, *", False),
        ("gzip;q=-1", False),
    ],
)
def test_gzip_is_served_when_accept_encoding_names_it_with_a_positive_q_value(
    header: str, wanted: bool
) -> None:
    from stormwatch.agent.server import gzip_wanted

    assert gzip_wanted(header) is wanted
