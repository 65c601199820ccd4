"""The cached ``/metrics`` exposition: rendered in the background, served as bytes.

Rendering every collector (8 GPUs x 18 NVLinks, the ranks' histograms merged
from their multiprocess files) costs tens of milliseconds; doing it inside each
scrape made the agent's scrape latency several times node_exporter's
(``benchmarks/agent_bench.py``). Instead a background task renders the
exposition (text format 0.0.4, ``prometheus_client.generate_latest``) once per
period and a scrape serves the cached bytes:

- it renders right after each GPU sample (the sampler notifies it; unless a scrape
  that came first already rendered that sample), and at the latest every period: the GPU sample interval capped at
  :data:`MAX_EXPOSITION_AGE` (1 s), so that rank and trainer state stay fresh when
  GPUs are sampled rarely;
- a scrape renders itself (in the executor) only when the cache is *stale*:
  nothing rendered yet, the GPU sampler published a snapshot the cache does not
  hold (a test's ``sample()``, or a render loop that fell behind), a
  state-changing request called :meth:`ExpositionCache.invalidate` (the fault
  API), the rank watcher saw a rank appear or exit (:meth:`ExpositionCache.changed`),
  or the cache is older than twice the period (the loop is stuck);
- renders are paced by the scrapers, so that an agent nobody scrapes (or one
  scraped every 15 s) does not render every second for nothing: the background
  renders after each trigger while scrapes arrive at least every 1.5 periods,
  and, for a slower scraper, once, after the last GPU sample before its next
  expected scrape
  (predicted from the median interval of the last :data:`SCRAPES_KEPT` scrapes;
  Prometheus scrapes a target at a fixed phase). Nobody scraping for three
  intervals: no renders at all. A scrape the prediction missed (or that comes
  after a newer sample) renders itself, as above;
- age gauges (``stormwatch_gpu_snapshot_age_seconds``,
  ``stormwatch_rank_watcher_scan_age_seconds``) are *not* cached: they are
  rendered per scrape by :class:`LiveAges` (a few microseconds) so they stay
  exact; nor is ``stormwatch_agent_render_duration_seconds`` (histogram of every
  render's wall time, background or in a scrape): a scrape that finds the cache
  stale waits one render, so it is what brings a scrape near its timeout
  (alert ``StormwatchAgentRenderSlow``).

Formats: the server negotiates with prometheus-client's ``choose_encoder`` (text
0.0.4 or OpenMetrics 1.0) and gzips when ``Accept-Encoding`` asks for it with a q-value
above 0 (:func:`stormwatch.agent.server.gzip_wanted`); the cache keeps one body per
format a scraper has asked for in the last :data:`FORMAT_KEEP_SECONDS` (text alone
before any scrape; :mod:`stormwatch.agent.textformat`), rendered together, so a
Prometheus that prefers OpenMetrics is served from the cache too, and pays for no text
body.

Gzip (what Prometheus asks for): the cached part of a body is compressed once per
render (:meth:`ExpositionCache.gzipped`); a scrape continues a copy of that
compressor's state (``zlib.Compress.copy``) with its live gauges and ends the stream,
so every scrape still gets one ordinary gzip stream of exactly the bytes of
:meth:`~ExpositionCache.body`, for a few microseconds more than the plain body. Level 1
(:data:`GZIP_LEVEL`).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import statistics
import threading
import time
import zlib
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.metrics import Histogram
from prometheus_client.utils import floatToGoString

from stormwatch.agent.collectors.base import new_family, new_histogram
from stormwatch.agent.gpu.sampler import GpuSampler
from stormwatch.agent.textformat import SampleLines, close
from stormwatch.agent.watch.ranks import RankWatcher

log = logging.getLogger(__name__)

#: Oldest (seconds) the cached rank and trainer state may get, whatever the sample interval.
MAX_EXPOSITION_AGE = 1.0
#: Scrape times kept to estimate the scrape interval.
SCRAPES_KEPT = 6
#: Buckets (seconds) of ``stormwatch_agent_render_duration_seconds``: prometheus-client's
#: defaults (5 ms .. 10 s), which span a few-ms render to one past a 10 s scrape timeout.
RENDER_BUCKETS: tuple[float, ...] = tuple(b for b in Histogram.DEFAULT_BUCKETS if b != math.inf)
#: A format (text 0.0.4 or OpenMetrics) no scrape asked for in this long (s), or in three
#: of the scrapers' median intervals when that is longer, is no longer rendered ahead (a
#: scrape that asks for it again renders it itself): a Prometheus that negotiates
#: OpenMetrics does not pay for a text body nobody reads.
FORMAT_KEEP_SECONDS = 300.0
#: zlib level of the gzipped exposition: the fastest (nginx's default ``gzip_comp_level``).
#: On the benchmark's 364 KB body: 0.85 ms and 28 KB, against 2.3 ms and 24 KB at 6.
GZIP_LEVEL = 1


class RenderDurations:
    """The histogram of render wall times (seconds); thread-safe."""

    def __init__(self, buckets: tuple[float, ...] = RENDER_BUCKETS) -> None:
        self._bounds = buckets
        self._counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf only)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            index = next((i for i, b in enumerate(self._bounds) if seconds <= b), -1)
            self._counts[index] += 1
            self._sum += seconds

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, n in zip((*self._bounds, math.inf), counts, strict=True):
            cumulative += n
            buckets.append((floatToGoString(bound), float(cumulative)))
        family = new_histogram("stormwatch_agent_render_duration_seconds")
        family.add_metric([], buckets=buckets, sum_value=total)
        yield family


class LiveAges:
    """The age gauges, computed at scrape time (never cached).

    Args:
        sampler: the GPU sampler (None when every GPU collector is off).
        watcher: the rank watcher (None when the ``ranks`` collector is off).
        clock: Unix time, the same clock as the sampler's and watcher's stamps.
    """

    def __init__(
        self,
        sampler: GpuSampler | None,
        watcher: RankWatcher | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sampler, self._watcher, self._clock = sampler, watcher, clock

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        snapshot = self._sampler.latest if self._sampler is not None else None
        if snapshot is not None and snapshot.error is None:
            age = new_family("stormwatch_gpu_snapshot_age_seconds")
            age.add_metric([], max(0.0, now - snapshot.taken_at))
            yield age
        if self._watcher is not None:
            scanned = self._watcher.last_scan_at
            if scanned is not None and self._watcher.last_error is None:
                scan = new_family("stormwatch_rank_watcher_scan_age_seconds")
                scan.add_metric([], max(0.0, now - scanned))
                yield scan


class ExpositionCache:
    """Holds the last rendered exposition; see the module docstring.

    Args:
        render: ``(openmetrics_format) -> bytes``, the full (cacheable) exposition in
            the text format 0.0.4 or OpenMetrics without ``# EOF``; blocking.
        live: the per-scrape part (:class:`LiveAges`), appended to the cached bytes.
        sampler: whose ``latest`` snapshot the cache must hold (None: no GPUs).
        period: seconds between background renders (> 0).
        monotonic: the clock of the cache's age.
        forget: called with a format once a render leaves it out (no scraper asked for it
            lately), so that the renderer drops what it kept for it
            (:meth:`.CollectorSet.forget_format`: the text format's family texts and line
            prefixes, rendered before Prometheus's first scrape asked for OpenMetrics).
    """

    def __init__(
        self,
        render: Callable[[bool], bytes],
        *,
        live: LiveAges,
        sampler: GpuSampler | None,
        period: float,
        monotonic: Callable[[], float] = time.monotonic,
        forget: Callable[[bool], None] | None = None,
    ) -> None:
        if period <= 0:
            raise ValueError(f"period must be > 0 (got {period})")
        self._render = render
        self._forget = forget
        self._live = CollectorRegistry(auto_describe=False)
        self._live.register(live)
        # The live gauges' series never change: their lines reuse the escaped labels.
        self._live_lines = {fmt: SampleLines(openmetrics_format=fmt) for fmt in (False, True)}
        self._sampler = sampler
        self.period = period
        self._monotonic = monotonic
        self._lock = threading.Lock()  # one render at a time
        self._bodies: dict[bool, bytes] = {}  # OpenMetrics? -> body
        # OpenMetrics? -> (the body compressed, its gzip stream so far, the compressor)
        self._gzipped: dict[bool, tuple[bytes, bytes, zlib._Compress]] = {}
        # OpenMetrics? -> when a scrape last asked for it (monotonic s), plain or gzipped
        self._asked: dict[bool, float] = {}
        self._asked_gzipped: dict[bool, float] = {}
        self._snapshot: object = None
        self._rendered_at = float("-inf")
        self._generation = 0  # bumped by invalidate()
        self._rendered_generation = -1
        self.renders = 0
        #: CPU seconds (of the rendering threads) every render took since construction.
        self.render_cpu_seconds = 0.0
        self._render_seconds = 0.0
        self.durations = RenderDurations()
        self._live.register(self.durations)
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scrapes: collections.deque[float] = collections.deque(maxlen=SCRAPES_KEPT)
        if sampler is not None:
            sampler.add_listener(self.notify)

    def invalidate(self) -> None:
        """Make the next scrape render (after a state change it must show)."""
        self._generation += 1

    def changed(self) -> None:
        """State changed (a rank appeared or exited): render now, and make a scrape
        that comes first render too. Thread-safe."""
        self.invalidate()
        self.notify()

    def refresh(self) -> bytes:
        """Render now (every format asked for so far) and keep the result; returns
        the text format's body (blocking; thread-safe)."""
        with self._lock:
            return self._refresh_locked(False)[False]

    def refresh_if_behind(self) -> bool:
        """The background's render: render now (every format asked for) unless a scrape
        already rendered what the cache must hold, i.e. the sampler's latest snapshot, the
        latest state change, less than a period ago (a scrape that came between a sample and
        this render rendered it itself; rendering again would double the CPU for nothing).
        Returns whether it rendered (blocking; thread-safe)."""
        with self._lock:
            snapshot = self._sampler.latest if self._sampler is not None else None
            if (
                self._bodies
                and snapshot is self._snapshot
                and self._rendered_generation == self._generation
                and self._monotonic() - self._rendered_at < self.period
                and self._wanted(self._asked) <= self._bodies.keys()
            ):
                return False
            self._refresh_locked()
            return True

    def _wanted(self, asked: dict[bool, float]) -> set[bool]:
        """The formats asked for in the last :data:`FORMAT_KEEP_SECONDS`, or in the last
        three median scrape intervals when that is longer (a scraper every 10 minutes)."""
        now = self._monotonic()
        scrapes = tuple(self._scrapes)
        keep = FORMAT_KEEP_SECONDS
        if len(scrapes) >= 2:
            keep = max(keep, 3 * statistics.median(b - a for a, b in itertools.pairwise(scrapes)))
        # tuple(): one copy under the GIL, while a scrape on the event loop may add a format
        return {fmt for fmt, at in tuple(asked.items()) if now - at <= keep}

    def _refresh_if_stale(self, openmetrics_format: bool) -> bytes:
        """Render unless a render that finished while we waited for the lock (the
        background's, or another scrape's) already made the cache fresh."""
        with self._lock:
            cached = self._bodies.get(openmetrics_format)
            if cached is not None and not self.stale():
                return cached
            return self._refresh_locked(openmetrics_format)[openmetrics_format]

    def _refresh_locked(self, also: bool | None = None) -> dict[bool, bytes]:
        """Render ``also`` and every format asked for lately (text when none was)."""
        generation = self._generation
        snapshot = self._sampler.latest if self._sampler is not None else None
        started = self._monotonic()
        cpu_started = time.thread_time()
        formats = self._wanted(self._asked) | ({also} if also is not None else set())
        formats = formats or {False}
        bodies = {fmt: self._render(fmt) for fmt in sorted(formats)}
        # compressed with the render: by the background, off the scrapes (or by the scrape
        # that found the cache stale), and published with the bodies below
        for fmt in self._wanted(self._asked_gzipped) & bodies.keys():
            self._compress(fmt, bodies[fmt], keep=True)
        for fmt in self._bodies.keys() - bodies.keys():  # lapsed: nobody asked lately
            self._gzipped.pop(fmt, None)
            if self._forget is not None:
                self._forget(fmt)
        self.render_cpu_seconds += time.thread_time() - cpu_started
        self._bodies = bodies
        self._snapshot = snapshot
        self._render_seconds = self._monotonic() - started
        self.durations.observe(self._render_seconds)
        self._rendered_generation = generation
        self._rendered_at = self._monotonic()
        self.renders += 1
        return bodies

    def stale(self) -> bool:
        """Whether a scrape must render instead of serving the cache."""
        snapshot = self._sampler.latest if self._sampler is not None else None
        return (
            not self._bodies
            or snapshot is not self._snapshot
            or self._rendered_generation != self._generation
            or self._monotonic() - self._rendered_at > 2 * self.period
        )

    def _until_due(self, now: float) -> float | None:
        """Seconds until a background render is due (<= 0: now); None: not wanted.

        A scraper at least every 1.5 periods: due at every trigger (0). A slower one
        (Prometheus every 15 s, at a fixed phase): due when the cache is stale within
        one period plus :attr:`lead` before its next expected scrape (the median of the
        recent intervals after the last one), i.e. after the last GPU sample before it.
        Nobody scraping for three intervals (or two periods, before an interval is
        known): never.
        """
        scrapes = list(self._scrapes)
        if not scrapes:
            return None
        last = scrapes[-1]
        if len(scrapes) < 3:
            return 0.0 if now - last <= 2 * self.period else None
        interval = max(statistics.median(b - a for a, b in itertools.pairwise(scrapes)), 1e-3)
        if now - last > 3 * max(interval, self.period):
            return None
        if interval <= 1.5 * self.period:
            return 0.0
        ahead = (math.floor(max(now - last, 0.0) / interval) + 1) * interval + last - now
        window = self.period + self.lead  # holds the last sample before the scrape
        if ahead > window:
            return ahead - window
        return 0.0 if self.stale() else None

    def wanted(self, now: float | None = None) -> bool:
        """Whether a background render now is likely to be served (see :meth:`_until_due`)."""
        due = self._until_due(self._monotonic() if now is None else now)
        return due is not None and due <= 0

    @property
    def lead(self) -> float:
        """How long before a slow scraper's expected scrape to render: twice the
        last render's duration plus 20 ms."""
        return 2 * self._render_seconds + 0.02

    def body(self, openmetrics_format: bool = False) -> bytes:
        """What ``/metrics`` serves: the cached (or, when stale, fresh) exposition
        followed by the live age gauges, in the text format 0.0.4 or OpenMetrics 1.0.
        Blocking only when stale (or on the first scrape asking for a format)."""
        cached, tail = self._parts(openmetrics_format)
        return cached + tail

    def gzipped(self, openmetrics_format: bool = False) -> bytes:
        """:meth:`body`'s bytes as one gzip stream (RFC 1952), the cached part compressed
        once per render (module docstring). Blocking as :meth:`body`; thread-safe."""
        self._asked_gzipped[openmetrics_format] = self._monotonic()
        cached, tail = self._parts(openmetrics_format)
        kept = self._gzipped.get(openmetrics_format)
        if kept is None or kept[0] is not cached:  # kept only while the body is the latest
            latest = self._bodies.get(openmetrics_format) is cached
            kept = self._compress(openmetrics_format, cached, keep=latest)
        _, head, compressor = kept
        rest = compressor.copy()  # the kept state stays at the end of the cached part
        return head + rest.compress(tail) + rest.flush()

    def gzip_ready(self, openmetrics_format: bool) -> bool:
        """Whether :meth:`gzipped` would serve without rendering or compressing."""
        kept = self._gzipped.get(openmetrics_format)
        cached = self._bodies.get(openmetrics_format)
        return kept is not None and kept[0] is cached and not self.stale()

    def _compress(
        self, fmt: bool, cached: bytes, *, keep: bool
    ) -> tuple[bytes, bytes, zlib._Compress]:
        """``cached`` compressed, and its compressor; ``keep``: kept for later scrapes (never
        for a body a newer render replaced: it would displace the newer one's)."""
        compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        kept = (cached, compressor.compress(cached), compressor)
        if keep:
            self._gzipped[fmt] = kept
        return kept

    def _parts(self, openmetrics_format: bool) -> tuple[bytes, bytes]:
        """(the cached exposition, this scrape's live gauges and end), counting the scrape."""
        self._scrapes.append(now := self._monotonic())
        self._asked[openmetrics_format] = now
        cached = self._bodies.get(openmetrics_format)
        if cached is None or self.stale():
            cached = self._refresh_if_stale(openmetrics_format)
        encode = self._live_lines[openmetrics_format].render
        live = b"".join(encode(family) for family in self._live.collect())
        return cached, close(live, openmetrics_format=openmetrics_format)

    def stale_for(self, openmetrics_format: bool) -> bool:
        """Whether a scrape in this format must render (stale, or never rendered)."""
        return openmetrics_format not in self._bodies or self.stale()

    def notify(self) -> None:
        """A new GPU snapshot was published: render now (thread-safe; a no-op until
        :meth:`run` started)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            loop.call_soon_threadsafe(wake.set)

    async def run(self) -> None:
        """Render after each GPU sample, and at least every ``period`` seconds (1.25 x
        with a sampler, so that its samples, not the timer, pace the renders), when
        :meth:`wanted`; until cancelled. Renders run in the executor."""
        loop = asyncio.get_running_loop()
        self._wake = wake = asyncio.Event()
        self._loop = loop
        timeout = self.period * (1.25 if self._sampler is not None else 1.0)
        try:
            while True:
                due = self._until_due(self._monotonic())
                wait = timeout if due is None or due <= 0 else min(due, timeout)
                # Not asyncio.wait_for: before Python 3.12 it can swallow a cancellation that
                # arrives as the wake fires, and the agent's stop then waits for this loop
                # forever (a rank exiting during the stop wakes it).
                woken = asyncio.ensure_future(wake.wait())
                try:
                    await asyncio.wait({woken}, timeout=wait)  # the timer: due, or no wake
                finally:
                    woken.cancel()
                wake.clear()
                if not self.wanted():
                    continue
                try:
                    await loop.run_in_executor(None, self.refresh_if_behind)
                except Exception:
                    log.exception("rendering the exposition failed; scrapes will retry")
        finally:
            self._loop = self._wake = None


__all__ = ["MAX_EXPOSITION_AGE", "RENDER_BUCKETS", "ExpositionCache", "LiveAges", "RenderDurations"]
