"""End to end, zero code changes (issue 16): the unmodified plain-DDP example under
``stormwatch run -- torchrun`` with a node agent watching.

Real parts throughout: ``stormwatch run``, torchrun, two gloo ranks of
examples/plain_ddp/train.py (no stormwatch import in it), the agent (in-process, as the
other agent tests). The agent counts the job's collectives; then rank 1 is stopped with
SIGSTOP (as a hang looks from outside: no progress, no exit, no signal handler runs).
The agent's hang detection fires on the progress heartbeat, and the dumps it asks the
ranks for name rank 1 from the flight recorder of rank 0, which waits inside the
all-reduce rank 1 never joins. Killing the stopped rank is then reported as its exit,
and the job's exit status comes back through ``stormwatch run``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from stormwatch.telemetry.dump import latest_dump

REPO = Path(__file__).resolve().parents[2]
STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))
_TORCHRUN = Path(sys.executable).with_name("torchrun")
TORCHRUN = (
    [str(_TORCHRUN)] if _TORCHRUN.exists() else [sys.executable, "-m", "torch.distributed.run"]
)
#: Seconds without progress before a rank is hung (the agent's floor; no step times here).
HANG_FLOOR = 4.0


def _events(tools: Any, agent: Any, job: str, kind: str) -> list[dict[str, Any]]:
    events = tools.http("GET", agent.url + "/v1/events").json()["events"]
    return [e for e in events if e["kind"] == kind and e["job"] == job]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_fc10_unmodified_ddp_job_is_counted_and_its_hung_rank_named_from_the_flight_recorder(
    start_agent: Any, tools: Any, tmp_path: Path
) -> None:
    # no step marks: judged at the warm-up threshold (no step time to scale by)
    agent = start_agent(
        hang_floor_seconds=HANG_FLOOR, hang_warmup_seconds=HANG_FLOOR, rank_scan_interval=0.2
    )
    metrics = Path(agent.config.metrics_dir)
    job = f"zc-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS"))}
    log = (tmp_path / "job.log").open("wb")
    torchrun = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.2"]
    script = [
        str(REPO / "examples/plain_ddp/train.py"),
        "--steps",
        "100000",
        "--step-delay",
        "0.05",
    ]
    launcher = subprocess.Popen(
        [STORMWATCH, "run", "--job", job, "--metrics-dir", str(metrics), "--", *torchrun, *script],
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:

        def ranks() -> dict[int, dict[str, Any]]:
            rows = tools.http("GET", agent.url + "/v1/ranks").json()["ranks"]
            return {row["rank"]: row for row in rows if row["job"] == job and row["alive"]}

        def all_reduces() -> list[float]:
            scrape = tools.scrape(agent.url)
            found = [
                scrape.value(
                    "stormwatch_collective_calls_total", training_job=job, rank=r, op="all_reduce"
                )
                for r in ("0", "1")
            ]
            return [n or 0.0 for n in found]

        found = tools.wait_for(lambda: (r := ranks()) and len(r) == 2 and r, timeout=120)
        assert psutil.Process(found[0]["pid"]).ppid() == launcher.pid  # it exec'd torchrun
        tools.wait_for(lambda: min(all_reduces()) >= 5, timeout=120)  # DDP's gradient all-reduces
        scrape = tools.scrape(agent.url)
        latency = "stormwatch_collective_latency_seconds_count"
        assert scrape.value(latency, training_job=job, rank="0", op="all_reduce", mesh_dim="world")

        os.kill(found[1]["pid"], signal.SIGSTOP)
        [culprit] = tools.wait_for(
            lambda: _events(tools, agent, job, "rank_hang_culprit"), timeout=60
        )
        assert (culprit["rank"], culprit["pid"]) == (1, found[1]["pid"]), culprit
        assert culprit["method"] == "flight_recorder" and culprit["certain"], culprit
        assert (culprit["asked"], culprit["answered"]) == ([0, 1], [0]), culprit
        hung = {e["rank"] for e in _events(tools, agent, job, "rank_hang")}
        assert 0 in hung  # the waiting rank stopped progressing too
        dump = latest_dump(metrics / "dumps", 0, since=0.0)  # what rank 0 answered
        assert dump is not None
        assert dump.reason.startswith("requested: hang of job") and dump.flight_recorder
        assert dump.group_status(), dump.flight_recorder_error
        report = (Path(culprit["diagnostics"]) / "rank1.txt").read_text()
        assert "culprit: rank 1 (flight_recorder, certain)" in report

        os.kill(found[1]["pid"], signal.SIGKILL)  # a stopped process dies of SIGKILL too
        [gone] = tools.wait_for(
            lambda: [e for e in _events(tools, agent, job, "rank_exit") if e["rank"] == 1],
            timeout=30,
        )
        assert (gone["reason"], gone["exit_signal"]) == ("signal", "SIGKILL"), gone
        assert launcher.wait(60) != 0  # torchrun's failure, through stormwatch run
    except BaseException:
        log.flush()
        print((tmp_path / "job.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGCONT)
            tools.stop_process_group(launcher)
        log.close()
