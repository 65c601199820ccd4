"""The agent's reader of prometheus-client multiprocess files parses a file again only when
its bytes changed, and reads exactly what the library reads (agent/watch/merge.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from stormwatch.agent.watch.merge import FileReader, merge, prepare


def _write(path: Path, rows: list[tuple[str, str, dict[str, str], float, float]]) -> None:
    """Write ``rows`` (metric, sample name, labels, value, timestamp) with the library's
    own writer, as a rank process does."""
    store = MmapedDict(str(path))
    try:
        for metric, name, labels, value, timestamp in rows:
            key = mmap_key(metric, name, list(labels), list(labels.values()), f"help {metric}")
            store.write_value(key, value, timestamp)
    finally:
        store.close()


def _folder(tmp_path: Path, step: float = 1.0) -> list[str]:
    rank = {"training_job": "train", "rank": "0"}
    peer = {"training_job": "train", "rank": "1"}
    _write(
        tmp_path / "counter_101.db",
        [
            ("stormwatch_collective_calls", "stormwatch_collective_calls_total", rank, 3.0, 0.0),
            ("stormwatch_train_steps", "stormwatch_train_steps_total", rank, step, 0.0),
        ],
    )
    _write(
        tmp_path / "counter_102.db",
        [("stormwatch_collective_calls", "stormwatch_collective_calls_total", peer, 4.0, 0.0)],
    )
    _write(
        tmp_path / "histogram_101.db",
        [
            ("stormwatch_step", "stormwatch_step_bucket", {**rank, "le": "0.5"}, 2.0, 0.0),
            ("stormwatch_step", "stormwatch_step_bucket", {**rank, "le": "+Inf"}, 3.0, 0.0),
            ("stormwatch_step", "stormwatch_step_sum", rank, 1.25, 0.0),
            ("stormwatch_step", "stormwatch_step_count", rank, 3.0, 0.0),
        ],
    )
    _write(
        tmp_path / "gauge_livemax_101.db",
        [("stormwatch_train_step", "stormwatch_train_step", rank, step, 0.0)],
    )
    _write(
        tmp_path / "gauge_mostrecent_102.db",
        [("stormwatch_train_loss", "stormwatch_train_loss", peer, 2.5, 1_700_000_000.0)],
    )
    return sorted(str(p) for p in tmp_path.glob("*.db"))


def _as_library(metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        name: (m.name, m.type, m.documentation, getattr(m, "_multiprocess_mode", None), m.samples)
        for name, m in metrics.items()
    }


def test_reads_what_the_library_reads_and_parses_only_changed_files(tmp_path: Path) -> None:
    files = _folder(tmp_path)
    reader = FileReader()
    assert _as_library(reader.read(files)) == _as_library(
        MultiProcessCollector._read_metrics(files)
    )
    assert reader.parsed == len(files)

    # Nothing changed: nothing parsed again, the same families.
    again = reader.read(files)
    assert reader.parsed == len(files)
    assert _as_library(again) == _as_library(MultiProcessCollector._read_metrics(files))

    # One rank stepped: its two files changed, and only those are parsed again.
    _folder(tmp_path, step=2.0)
    stepped = reader.read(files)
    assert reader.parsed == len(files) + 2
    assert _as_library(stepped) == _as_library(MultiProcessCollector._read_metrics(files))
    [step] = stepped["stormwatch_train_step"].samples
    assert step.value == 2.0


def test_a_caller_replacing_samples_does_not_change_the_next_read(tmp_path: Path) -> None:
    files = _folder(tmp_path)
    reader = FileReader()
    first = merge(files, accumulate=True, reader=reader)
    for family in first:  # what TrainerCollector does to leave out unencodable samples
        family.samples = []
    assert merge(files, accumulate=True, reader=reader) == merge(files, accumulate=True)


def test_a_live_gauge_file_removed_is_skipped_and_any_other_missing_file_raises(
    tmp_path: Path,
) -> None:
    files = _folder(tmp_path)
    reader = FileReader()
    reader.read(files)
    os.unlink(tmp_path / "gauge_livemax_101.db")  # mark_process_dead since the listing
    assert "stormwatch_train_step" not in reader.read(files)
    os.unlink(tmp_path / "counter_102.db")
    with pytest.raises(FileNotFoundError):
        reader.read(files)


def test_a_file_with_the_same_name_but_new_bytes_is_parsed_again(tmp_path: Path) -> None:
    """A pid reused by a new process: same file name, new content."""
    files = _folder(tmp_path)
    reader = FileReader()
    reader.read(files)
    os.unlink(tmp_path / "counter_102.db")
    _write(
        tmp_path / "counter_102.db",
        [
            (
                "stormwatch_collective_calls",
                "stormwatch_collective_calls_total",
                {"training_job": "b"},
                1,
                0,
            )
        ],
    )
    read = reader.read(files)
    assert _as_library(read) == _as_library(MultiProcessCollector._read_metrics(files))
    reader.retain(files[:1])
    assert reader.read(files[:1]) and reader.parsed == len(files) + 1


def test_a_merge_is_reused_only_while_no_file_and_no_accumulator_changed(tmp_path: Path) -> None:
    files = _folder(tmp_path)
    reader = FileReader()
    first = merge(files, accumulate=True, reader=reader)
    assert merge(files, accumulate=True, reader=reader) == first == merge(files, accumulate=True)
    assert merge(files, accumulate=False, reader=reader) == merge(files, accumulate=False)

    _folder(tmp_path, step=7.0)  # a rank stepped: the next merge sees it
    stepped = {f.name: f for f in merge(files, accumulate=True, reader=reader)}
    assert stepped["stormwatch_train_step"].samples[0].value == 7.0
    assert list(stepped.values()) == merge(files, accumulate=True)

    # The accumulator's files folded anew (another Folded, the same running files): merged
    # again, not reused.
    once = merge(files[1:], accumulate=True, extra=prepare(files[:1]), reader=reader)
    assert once == merge(files[1:], accumulate=True, extra=prepare(files[:1]))
    twice = prepare([files[0], files[0]])  # the first file's counters twice over
    refolded = merge(files[1:], accumulate=True, extra=twice, reader=reader)
    assert refolded == merge(files[1:], accumulate=True, extra=twice) != once
