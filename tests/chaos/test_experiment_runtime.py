"""The language at run time, on real stand-in ranks (no lab): safeguards abort and revert,
background actions, target selection, the blast-radius guard, and the OpenTelemetry trace
that the journal links to."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from stormwatch.chaos import (
    AttachedJobs,
    Ledger,
    Runner,
    RunnerConfig,
    Target,
    ledger_path,
    parse_experiment,
)
from stormwatch.chaos.execution.runner import ExperimentRun


def _run(tmp_path: Path, job: str, text: str, world_size: int = 1) -> ExperimentRun:
    run_dir = tmp_path / "run"
    target = Target(
        run_dir=run_dir, jobs=AttachedJobs(run_dir, world_size=world_size), world_size=world_size
    )
    runner = Runner(
        parse_experiment(text),
        source=Path("inline.yaml"),
        target=target,
        config=RunnerConfig(attach_job=job),
    )
    return asyncio.run(runner.run())


def _frozen_with_safeguard(job: str) -> str:
    return f"""
version: 1
title: a safeguard stops a freeze
job: {{name: {job}, steps: 1000000, checkpoint_every: 10}}
steady_state_hypothesis:
  title: the rank steps
  probes:
    - name: rank-progressing
      provider: {{type: progress, min_steps: 2, window_seconds: 2}}
      timeout_seconds: 5
method:
  - type: action
    name: freeze
    target: {{role: leader}}
    fault: {{kind: freeze_rank, ttl_seconds: 3600}}
  - {{type: pause, name: long-hold, seconds: 60}}
safeguards:
  - name: keeps-stepping
    provider: {{type: progress, min_steps: 1, window_seconds: 1.5}}
    interval_seconds: 0.5
"""


def test_a_failing_safeguard_stops_the_method_fails_the_run_and_reverts_the_fault(
    tmp_path: Path, start_workload: Any, unique_job: Any, wait_until: Any, find_reapers: Any
) -> None:
    job = unique_job("safeguard")
    workload = start_workload(job)

    result = _run(tmp_path, job, _frozen_with_safeguard(job))

    journal = result.journal
    assert result.exit_code == 1
    assert journal.status == "failed"
    assert journal.error is not None and "safeguard keeps-stepping tripped" in journal.error
    by_name = {r.name: r for r in journal.method}
    assert by_name["freeze"].status == "succeeded"
    assert by_name["long-hold"].status == "aborted", "the 60 s pause was cut short"
    assert by_name["keeps-stepping"].type == "safeguard"
    assert by_name["keeps-stepping"].status == "failed"
    [entry] = Ledger(ledger_path(tmp_path / "run"), create=False).entries()
    assert entry.state == "reverted" and entry.spec.rank == 0  # the target filled the rank
    assert not workload.stopped
    steps = workload.steps()
    wait_until(lambda: workload.steps() > steps, 10, "the rank to step again")
    wait_until(lambda: not find_reapers(ledger_path(tmp_path / "run")), 10, "the reaper to exit")


def test_every_activity_is_a_span_of_the_experiment_trace_the_journal_names(
    tmp_path: Path, start_workload: Any, unique_job: Any
) -> None:
    job = unique_job("trace")
    start_workload(job)
    text = f"""
version: 1
title: traced
job: {{name: {job}, steps: 1000000, checkpoint_every: 10}}
steady_state_hypothesis:
  title: the rank steps
  probes:
    - name: rank-progressing
      provider: {{type: progress, min_steps: 1, window_seconds: 5}}
      timeout_seconds: 5
    - name: loss-sane
      provider: {{type: loss, max_ratio: 1000}}
method:
  - type: action
    name: freeze-in-background
    fault: {{kind: freeze_rank, rank: 0, ttl_seconds: 60}}
    background: true
  - {{type: pause, name: hold, seconds: 0.3}}
rollbacks:
  - {{type: revert, name: undo}}
"""
    result = _run(tmp_path, job, text)

    journal = result.journal
    assert journal.trace_id is not None and len(journal.trace_id) == 32
    spans = [
        json.loads(line)
        for line in (result.journal_path.parent / "spans.jsonl").read_text().splitlines()
    ]
    trace_ids = {s["context"]["trace_id"] for s in spans}
    assert trace_ids == {f"0x{journal.trace_id}"}
    span_ids = {s["context"]["span_id"] for s in spans}
    records = (
        journal.steady_state_before.probes
        + journal.method
        + journal.steady_state_after.probes
        + journal.rollbacks
    )
    assert records and all(f"0x{r.span_id}" in span_ids for r in records)
    [root] = [s for s in spans if s["name"] == "experiment"]
    assert all(s["parent_id"] == root["context"]["span_id"] for s in spans if s is not root)
    background = [r for r in journal.method if r.name == "freeze-in-background"]
    assert background and background[0].status == "succeeded"
    assert isinstance(background[0].output, dict) and background[0].output["background"] is True
    assert journal.rollbacks_ok is True


def test_the_blast_radius_guard_refuses_before_anything_is_injected(
    tmp_path: Path, start_workload: Any, unique_job: Any
) -> None:
    job = unique_job("blast")
    start_workload(job, rank=0)
    start_workload(job, rank=1)
    text = f"""
version: 1
title: too wide
job: {{name: {job}, steps: 1000000, checkpoint_every: 10}}
steady_state_hypothesis:
  title: steps
  probes:
    - name: rank-progressing
      provider: {{type: progress, min_steps: 1, window_seconds: 5}}
      timeout_seconds: 5
method:
  - type: action
    name: freeze-all
    target: {{role: any}}
    fault: {{kind: freeze_rank, ttl_seconds: 60}}
blast_radius: {{max_fraction_of_ranks: 0.5}}
"""
    # Two ranks, a fault on both: 2 > floor(0.5 * 2) = 1. Only the live job shows it (the
    # file fixes no shape), so the runner refuses before the method.
    result = _run(tmp_path, job, text, world_size=2)

    assert result.exit_code == 1
    assert result.journal.error is not None and "blast radius" in result.journal.error
    assert result.journal.method == []
    assert Ledger(ledger_path(tmp_path / "run"), create=False).entries() == []


def test_the_http_probe_checks_status_and_body_of_a_real_server(tmp_path: Path) -> None:
    import http.server
    import threading

    import aiohttp

    from stormwatch.chaos.execution.probes import ProbeContext, check
    from stormwatch.chaos.experiment.model import HttpProvider
    from stormwatch.contracts.journal import JobRef

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if self.path == "/healthz" else 503
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b'{"status": "ok"}' if code == 200 else b"down")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    async def probe(url: str, **fields: Any) -> Any:
        async with aiohttp.ClientSession() as session:
            ctx = ProbeContext(
                job=JobRef(name="j", log_dir=tmp_path, world_size=1, started_by_runner=False),
                jobs=AttachedJobs(tmp_path, world_size=1),
                prometheus=None,
                variables={"job": "j"},
                session=session,
            )
            return await check(HttpProvider(type="http", url=url, **fields), ctx)

    try:
        assert asyncio.run(probe(f"{base}/healthz", contains='"ok"')).ok
        down = asyncio.run(probe(f"{base}/other"))
        assert not down.ok and "HTTP 503, wanted 200" in down.detail
        lacks = asyncio.run(probe(f"{base}/healthz", contains="ready"))
        assert not lacks.ok and "body lacks 'ready'" in lacks.detail
    finally:
        server.shutdown()
        server.server_close()
    refused = asyncio.run(probe(f"{base}/healthz", timeout_seconds=2.0))
    assert not refused.ok and "ClientConnectorError" in refused.detail


def test_the_default_rollback_strategy_skips_rollbacks_when_the_hypothesis_failed_before(
    tmp_path: Path, start_workload: Any, unique_job: Any
) -> None:
    job = unique_job("default-strategy")
    start_workload(job)
    text = f"""
version: 1
title: never steady
job: {{name: {job}, steps: 1000000, checkpoint_every: 10}}
steady_state_hypothesis:
  title: impossible
  probes:
    - name: ten-thousand-steps-a-second
      provider: {{type: progress, min_steps: 10000, window_seconds: 1}}
method:
  - type: action
    name: freeze
    fault: {{kind: freeze_rank, rank: 0, ttl_seconds: 60}}
rollbacks:
  - {{type: pause, name: settle, seconds: 0.1}}
rollback_strategy: default
"""
    result = _run(tmp_path, job, text)

    journal = result.journal
    assert journal.status == "failed" and journal.steady_state_before.met is False
    assert [(r.name, r.status) for r in journal.method] == []
    [skipped] = journal.rollbacks
    assert skipped.status == "skipped"
    assert isinstance(skipped.output, dict) and "'default'" in str(skipped.output["reason"])
