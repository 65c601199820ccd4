"""What a failed job says (fast: torchrun logs as torchrun writes them)."""

from __future__ import annotations

from pathlib import Path

from stormwatch.lab.jobs.launch import failure_lines

WORKER_FAILED = """\
ValueError: boom
E1130 12:52:00.183000 30969 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 3) local_rank: 0 (pid: 31104) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
  exitcode  : 3 (pid: 31104)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""

RDZV_PORT_TAKEN = """\
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/rendezvous/c10d_rendezvous_backend.py", line 159, in _create_tcp_store
torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: 29400, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use
The above exception was the direct cause of the following exception:
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.
"""


def test_failure_lines_pick_the_errors_not_the_banner(tmp_path: Path) -> None:
    log = tmp_path / "node0.torchrun.log"
    log.write_text(WORKER_FAILED)
    lines = failure_lines(log)
    assert lines[0] == "ValueError: boom"
    assert "failed (exitcode: 3)" in lines[1]
    assert not any("error_file" in line or "To enable traceback" in line for line in lines)

    log.write_text(RDZV_PORT_TAKEN)
    assert any("EADDRINUSE" in line for line in failure_lines(log))


def test_failure_lines_fall_back_to_the_last_lines_and_survive_a_missing_log(
    tmp_path: Path,
) -> None:
    log = tmp_path / "node1.torchrun.log"
    log.write_text("starting\nrendezvous\nno route to host\n")
    assert failure_lines(log) == ["starting", "rendezvous", "no route to host"]
    assert failure_lines(tmp_path / "missing.log") == []
