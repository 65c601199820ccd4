"""Dump requests, as a rank of ``stormwatch run`` answers them (:mod:`.dumps`): real files,
the real watcher thread, the real dumper."""

from __future__ import annotations

import time
from pathlib import Path

from stormwatch.telemetry.dump import RankDumper, latest_dump
from stormwatch.telemetry.dump_requests import (
    DumpRequestWatcher,
    read_request,
    request_path,
    write_request,
)


def test_each_new_request_is_answered_once(tmp_path: Path) -> None:
    reasons: list[str] = []
    watcher = DumpRequestWatcher(tmp_path, 3, reasons.append, started_at=100.0)
    assert not watcher.poll()  # no request: nothing
    write_request(tmp_path, 3, "old", now=99.0)  # from before this process: not answered
    assert not watcher.poll()
    write_request(tmp_path, 3, "hang of job j", now=101.0)
    assert watcher.poll() and reasons == ["requested: hang of job j"]
    assert not watcher.poll()  # the same request again: nothing
    write_request(tmp_path, 3, "", now=102.0)
    assert watcher.poll() and reasons[-1] == "requested"
    request_path(tmp_path, 3).write_text("{not json")
    assert not watcher.poll()  # a torn or foreign file asks for nothing
    write_request(tmp_path, 4, "another rank's", now=103.0)
    assert not watcher.poll()


def test_a_failing_dump_does_not_stop_the_watcher(tmp_path: Path) -> None:
    def broken(reason: str) -> None:
        raise OSError("disk full")

    watcher = DumpRequestWatcher(tmp_path, 0, broken, started_at=0.0)
    write_request(tmp_path, 0, "x", now=1.0)
    assert watcher.poll()  # asked, failed, logged
    write_request(tmp_path, 0, "y", now=2.0)
    assert watcher.poll()


def test_the_thread_writes_the_ranks_dump_when_asked(tmp_path: Path) -> None:
    dumper = RankDumper(tmp_path, rank=0, attempt=2)
    watcher = DumpRequestWatcher(tmp_path, 0, dumper.dump, interval=0.05)
    watcher.start()
    try:
        asked = time.time()
        write_request(tmp_path, 0, "hang of job j", now=asked)
        deadline = time.monotonic() + 30
        while (record := latest_dump(tmp_path, 0, since=0.0)) is None:
            assert time.monotonic() < deadline, "no dump written"
            time.sleep(0.05)
    finally:
        watcher.stop()
    assert (record.rank, record.attempt, record.reason) == (0, 2, "requested: hang of job j")
    assert record.time is not None and record.time >= asked


def test_a_request_dated_far_ahead_is_ignored_and_later_ones_are_answered(tmp_path: Path) -> None:
    reasons: list[str] = []
    watcher = DumpRequestWatcher(tmp_path, 0, reasons.append, started_at=time.time() - 10)
    write_request(tmp_path, 0, "from the future", now=time.time() + 3600)
    assert not watcher.poll() and reasons == []
    write_request(tmp_path, 0, "now", now=time.time())
    assert watcher.poll() and reasons == ["requested: now"]


def test_a_request_path_that_is_a_fifo_is_never_read(tmp_path: Path) -> None:
    import os
    import threading

    os.mkfifo(request_path(tmp_path, 0))
    watcher = DumpRequestWatcher(tmp_path, 0, lambda reason: None, started_at=0.0)
    results: list[object] = []
    looking = threading.Thread(
        target=lambda: results.extend([watcher.poll(), read_request(request_path(tmp_path, 0))]),
        daemon=True,  # before the fix it blocks in open() for ever
    )
    looking.start()
    looking.join(5)
    assert results == [False, None]
