"""Post-mortem dumps: flight recorder plus our collective record, written atomically, never raising."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from stormwatch.trainer.telemetry.comms import CollectiveCounter
from stormwatch.trainer.telemetry.dump import RankDumper, dump_path, flight_recorder_environ


class NullSink:
    def on_issue(self, op: str, nbytes: int) -> None: ...
    def on_complete(self, op: str, seconds: float) -> None: ...
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
    assert path == dump_path(tmp_path / "dumps", 0)
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
