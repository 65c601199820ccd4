"""A rank's start-up timeline: parts in order, wall and CPU seconds, and the import GC pause."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from stormwatch.trainer.startup import StartupTimeline, imports_without_gc


def test_each_part_runs_from_the_end_of_the_one_before() -> None:
    timeline = StartupTimeline(
        process_start=100.0,
        marks=[("cli", 100.5, 0.3), ("imports", 103.0, 2.3), ("rendezvous", 103.25, 2.35)],
    )
    assert timeline.seconds() == {"cli": 0.5, "imports": 2.5, "rendezvous": 0.25}
    assert timeline.cpu_seconds() == pytest.approx({"cli": 0.3, "imports": 2.0, "rendezvous": 0.05})
    assert timeline.total() == 3.25
    assert timeline.describe().startswith("cli 0.50 s (CPU 0.30 s), imports 2.50 s (CPU 2.00 s)")


def test_a_timeline_of_this_process_starts_before_its_first_mark() -> None:
    timeline = StartupTimeline.of_this_process()
    timeline.mark("cli")
    ((part, end, cpu),) = timeline.marks
    assert part == "cli" and timeline.process_start <= end and cpu > 0
    assert timeline.total() > 0


@pytest.fixture
def gc_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("enabled", [True, False])
def test_imports_pause_the_collector_then_freeze_and_restore_it(
    gc_restored: None, enabled: bool
) -> None:
    (gc.enable if enabled else gc.disable)()
    with imports_without_gc():
        assert not gc.isenabled()
    assert gc.get_freeze_count() > 0
    assert gc.isenabled() is enabled


def test_the_training_path_imports_no_optional_stack() -> None:
    # What `stormwatch train` imports before its first step: nothing of the other
    # components, the fault registry, OTLP exporters or the reporting libraries.
    code = (
        "import sys, stormwatch.trainer.cli, stormwatch.trainer.loop\n"
        "prefixes = ('stormwatch.agent', 'stormwatch.chaos', 'stormwatch.lab', 'stormwatch.alerts',"
        " 'stormwatch.faults.registry', 'opentelemetry.exporter', 'grpc', 'rich', 'aiohttp',"
        " 'matplotlib', 'httpx', 'yaml')\n"
        "print(sorted(m for m in sys.modules if m.startswith(prefixes)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
