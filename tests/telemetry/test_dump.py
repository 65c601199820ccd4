"""Post-mortem dumps: flight recorder plus our collective record, written atomically, never raising."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from stormwatch.telemetry.comms import CollectiveCounter
from stormwatch.telemetry.dump import (
    RankDumper,
    dump_path,
    flight_recorder_environ,
    latest_dump,
    read_all_dumps,
    read_dump,
    read_dumps,
)


class NullSink:
    def on_issue(self, op: str, nbytes: int) -> None: ...
    def on_complete(self, op: str, seconds: float, ago: float = 0.0) -> None: ...
    def on_error(self, where: str, exc: BaseException) -> None:
        raise AssertionError(exc)


def test_dump_holds_the_flight_recorder_and_the_last_collectives(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        counter = CollectiveCounter(NullSink(), recent=2)
        with counter:
            for _ in range(3):
                dist.all_reduce(torch.ones(4))
        dumper = RankDumper(tmp_path / "dumps", rank=0, attempt=2, recent=counter.recent)
        dumper.step = 7
        path = dumper.dump("RuntimeError: timed out")
    finally:
        dist.destroy_process_group()
    assert path == dump_path(tmp_path / "dumps", 0, attempt=2, pid=os.getpid())
    assert path.name == f"rank0.attempt2.pid{os.getpid()}.json"
    dump = json.loads(path.read_text())
    assert (dump["rank"], dump["attempt"], dump["step"]) == (0, 2, 7)
    assert dump["reason"] == "RuntimeError: timed out"
    assert [c["seq"] for c in dump["collectives"]] == [2, 3]  # ring of 2
    assert all(c["op"] == "all_reduce" and c["mesh_dim"] == "world" for c in dump["collectives"])
    names = [e["profiling_name"] for e in dump["flight_recorder"]["entries"]]
    assert names.count("gloo:all_reduce") >= 3
    assert list(tmp_path.joinpath("dumps").iterdir()) == [path]  # no temporary file left


def test_dump_is_off_without_a_folder_and_never_raises(tmp_path):
    assert RankDumper(None, rank=0, attempt=0).dump("x") is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert RankDumper(blocked / "dumps", rank=0, attempt=0).dump("x") is None


def test_flight_recorder_environ_respects_the_users_choice(tmp_path, monkeypatch):
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert flight_recorder_environ(tmp_path, 100) == {
        "TORCH_FR_BUFFER_SIZE": "100",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "nccl_trace_rank_"),
    }
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "5")
    assert flight_recorder_environ(None, 100) == {}


def test_every_key_of_a_dump_reads_back_through_its_model(tmp_path: Path) -> None:
    recent = [{"seq": 226, "op": "all_reduce", "seconds": None}]
    dumper = RankDumper(tmp_path, rank=2, attempt=1, recent=lambda: recent, clock=lambda: 50.0)
    dumper.step = 21
    dumper.phase = "checkpoint_load"
    path = dumper.dump("Terminated")
    assert path is not None
    written = json.loads(path.read_text())
    assert list(written) == [
        "rank", "attempt", "pid", "time", "reason", "errno", "step", "phase",
        "flight_recorder", "flight_recorder_error", "collectives",
    ]  # fmt: skip
    record = read_dump(path)
    assert (record.rank, record.attempt, record.time, record.step) == (2, 1, 50.0, 21)
    assert record.phase == "checkpoint_load"
    assert record.reason == "Terminated" and record.collectives == recent
    assert record.in_collective()  # our record has a collective never observed complete


def test_the_flight_recorder_counters_read_as_numbers_and_odd_entries_are_left_out(
    tmp_path: Path,
) -> None:
    dump = {
        "rank": 0, "time": 10.0, "reason": None,
        "flight_recorder": {"pg_status": {
            "0": {"last_enqueued_collective": "55", "last_completed_collective": "-1"},
            "1": "not a status",
            "2": {"last_enqueued_collective": "soon"},
        }},
        "collectives": [{"error": "RuntimeError: gone"}],
    }  # fmt: skip
    (tmp_path / "rank0.json").write_text(json.dumps(dump))
    record = read_dump(tmp_path / "rank0.json")
    status = record.group_status()
    # the default group ("0") keeps its key on every rank; "2", without a ring entry naming
    # it, is this rank's alone
    assert sorted(status) == ["default_pg:0", "rank0/pg2"] and record.reason == ""
    default = status["default_pg:0"]
    assert (default.last_enqueued_collective, default.last_completed_collective) == (55, -1)
    assert status["rank0/pg2"].last_enqueued_collective is None
    assert not record.in_collective()


def test_dumps_before_the_window_or_not_dumps_at_all_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0, "time": 100.0}))
    (tmp_path / "rank1.json").write_text(json.dumps({"rank": 1, "time": 10.0}))  # too old
    (tmp_path / "rank2.json").write_text('{"rank": 2, "ti')  # torn
    (tmp_path / "rank3.json").write_text(json.dumps({"rank": "3", "time": 100.0}))  # not ours
    assert sorted(read_dumps(tmp_path, since=50.0)) == [0]
    assert read_dumps(tmp_path / "missing", since=0.0) == {}


def test_the_dump_model_imports_without_torch() -> None:
    code = (
        "import sys\n"
        "import stormwatch.telemetry.dump\n"
        "assert 'torch' not in sys.modules, 'importing the dump model imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_dumps_at_once_in_one_process_all_land_and_no_reader_sees_a_torn_file(
    tmp_path: Path,
) -> None:
    """The SIGTERM thread and a dump request may dump at the same moment."""
    import threading

    dumper = RankDumper(tmp_path, rank=0, attempt=0)
    mine = dump_path(tmp_path, 0, attempt=0, pid=os.getpid())  # one process: one file
    results: list[Path | None] = []
    torn: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                json.loads(mine.read_text())
            except FileNotFoundError:
                continue
            except ValueError as exc:
                torn.append(str(exc))

    def write() -> None:
        results.extend(dumper.dump("at once") for _ in range(40))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write) for _ in range(4)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    reader.join()
    assert results == [mine] * 160
    assert not torn
    assert list(tmp_path.iterdir()) == [mine]  # no temporary file left


def test_every_attempt_keeps_its_own_dump_and_readers_take_the_latest_per_rank(
    tmp_path: Path,
) -> None:
    """A restarted rank wrote over its one ``rank<R>.json``: the dump of the attempt that
    failed was gone once the next attempt dumped. Each incarnation now has its own file,
    and a file of an older writer is still read."""
    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0, "time": 5.0, "attempt": 0}))
    clock = iter([10.0, 20.0])
    first = RankDumper(tmp_path, rank=0, attempt=1, clock=lambda: next(clock))
    assert first.dump("attempt 1 failed") is not None
    second = RankDumper(tmp_path, rank=0, attempt=2, clock=lambda: next(clock))
    assert second.dump("attempt 2 failed") is not None  # same pid here: the attempt tells
    assert [(d.attempt, d.reason) for d in read_all_dumps(tmp_path, since=0.0)] == [
        (0, ""),
        (1, "attempt 1 failed"),
        (2, "attempt 2 failed"),
    ]
    assert read_dumps(tmp_path, since=0.0)[0].attempt == 2
    latest = latest_dump(tmp_path, 0, since=15.0)
    assert latest is not None and latest.attempt == 2
    assert latest_dump(tmp_path, 0, since=25.0) is None
    assert latest_dump(tmp_path, 1, since=0.0) is None
    legacy = latest_dump(tmp_path, 0, since=0.0)
    assert legacy is not None and legacy.time == 20.0


def test_a_dump_of_an_exception_records_its_errno(tmp_path: Path) -> None:
    """A store that cannot listen: torch's errno-less DistNetworkError text carries
    ``code: -98``; an OSError carries the errno itself."""
    dumper = RankDumper(tmp_path, rank=1, attempt=1)
    torch_text = (
        "The server socket has failed to listen on any local network address. port: 29400, "
        "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    )
    path = dumper.dump(RuntimeError(torch_text))
    assert path is not None
    record = read_dump(path)
    assert record.errno == errno.EADDRINUSE and record.reason.startswith("RuntimeError: ")
    try:
        raise RuntimeError("rendezvous failed") from OSError(errno.EADDRINUSE, "in use")
    except RuntimeError as exc:
        path = dumper.dump(exc)
    assert path is not None and read_dump(path).errno == errno.EADDRINUSE
    path = dumper.dump(ValueError("boom"))
    assert path is not None and read_dump(path).errno is None


def test_errno_is_read_from_torch_s_code_and_name_only_and_respects_from_none(
    tmp_path: Path,
) -> None:
    """ "exit code: -98" of a signalled process is no errno; ``raise ... from None`` hides
    the OSError it replaced, as a traceback does; an exception whose str() raises is still
    dumped, named by its type."""
    dumper = RankDumper(tmp_path, rank=0, attempt=0)
    path = dumper.dump(RuntimeError("worker exited with exit code: -98"))
    assert path is not None and read_dump(path).errno is None
    try:
        try:
            raise OSError(errno.EADDRINUSE, "in use")
        except OSError:
            raise ValueError("bad option") from None
    except ValueError as exc:
        path = dumper.dump(exc)
    assert path is not None and read_dump(path).errno is None

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("boom")

    path = dumper.dump(Unprintable())
    assert path is not None and read_dump(path).reason.startswith("Unprintable")


def test_readers_skip_what_is_no_dump_and_keep_to_the_window(tmp_path: Path) -> None:
    """A non-UTF-8 file, a folder and a FIFO named like dumps are skipped (never opened:
    a FIFO would block); ``until`` leaves out a later incident's dumps."""
    good = RankDumper(tmp_path, rank=0, attempt=0, clock=lambda: 100.0).dump("first")
    later = RankDumper(tmp_path, rank=1, attempt=3, clock=lambda: 5000.0).dump("later")
    assert good is not None and later is not None
    (tmp_path / "rank2.json").write_bytes(b'{"rank": 2, "reason": "\xff"}')
    (tmp_path / "rank3.json").mkdir()
    os.mkfifo(tmp_path / "rank4.json")
    assert [d.rank for d in read_all_dumps(tmp_path, 0.0)] == [0, 1]
    assert [d.rank for d in read_all_dumps(tmp_path, 0.0, until=1200.0)] == [0]
    assert set(read_dumps(tmp_path, 0.0, until=1200.0)) == {0}
