"""The experiment journal has one model: what the runner writes, every reader loads."""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import pytest

import stormwatch.contracts.journal as journal_module
from stormwatch.chaos.errors import ActivityFailed, ChaosError
from stormwatch.chaos.execution.journal_writer import JournalWriter
from stormwatch.contracts.journal import (
    ActivityRecord,
    FaultInjected,
    JobRef,
    Journal,
    load_journal,
    write_journal,
)

#: The keys of a fault action's output, in the order the runner has always written them.
FAULT_OUTPUT_KEYS = [
    "fault_id",
    "kind",
    "rank",
    "node",
    "target_pid",
    "applied_at",
    "expires_at",
    "step",
    "attempt",
    "detail",
    "background",
]


def _journal(tmp_path: Path) -> Journal:
    return Journal(
        experiment_id="exp-1",
        title="Kill rank 1",
        file=Path("kill-rank.yaml"),
        experiment={"title": "Kill rank 1", "job": {"steps": 50}},
        started_at=100.0,
        job=JobRef(name="j", log_dir=tmp_path / "logs", world_size=4, started_by_runner=True),
    )


def _injected() -> FaultInjected:
    return FaultInjected(
        fault_id="exp-1.kill",
        kind="kill_rank",
        rank=1,
        node="node0",
        target_pid=4242,
        applied_at=105.5,
        expires_at=225.5,
        step=25,
        attempt=0,
        detail="SIGKILL to rank 1 (pid 4242) on node0",
        background=False,
    )


async def _run(writer: JournalWriter) -> None:
    async with writer.activity("kill", "action", "method") as record:
        record.output = _injected().model_dump()
    async with writer.activity("probe", "probe", "after", raise_on_failure=False):
        raise ChaosError("no step in the window")
    writer.skipped("settle", "pause", "rollbacks", "the method failed")
    with pytest.raises(ActivityFailed):
        async with writer.activity("revert", "revert", "cleanup"):
            raise ChaosError("agent unreachable")


def test_the_journal_the_writer_writes_round_trips_through_the_model(tmp_path: Path) -> None:
    path = tmp_path / "exp-1" / "journal.json"
    path.parent.mkdir()
    writer = JournalWriter(_journal(tmp_path), path)
    asyncio.run(_run(writer))

    loaded = load_journal(path)
    assert loaded == writer.journal
    assert path.read_text() == loaded.model_dump_json(indent=2)
    assert [r.status for r in loaded.method] == ["succeeded"]
    assert [(r.status, r.error) for r in loaded.steady_state_after.probes] == [
        ("failed", "no step in the window")
    ]
    assert [r.status for r in loaded.rollbacks + loaded.cleanup] == ["skipped", "failed"]


def test_a_fault_action_output_keeps_its_keys_and_reads_back_typed(tmp_path: Path) -> None:
    path = tmp_path / "journal.json"
    journal = _journal(tmp_path)
    output = _injected().model_dump()
    assert list(output) == FAULT_OUTPUT_KEYS
    journal.method.append(
        ActivityRecord(
            name="kill", type="action", phase="method", start=100.0, end=106.0, output=output
        )
    )
    write_journal(journal, path)
    [record] = json.loads(path.read_text())["method"]
    assert list(record["output"]) == FAULT_OUTPUT_KEYS
    loaded = load_journal(path)
    assert loaded.method[0].fault_injected() == _injected()
    assert loaded.injected_faults() == [_injected()]


@pytest.mark.parametrize(
    ("output", "found"),
    [
        ({"ok": True, "detail": "held"}, None),  # a probe's output
        ([{"fault_id": "f1", "outcome": "reverted"}], None),  # a revert's output
        ({"applied_at": None, "kind": "kill_rank"}, None),
        ({"applied_at": "soon"}, None),  # not a time: not a fault this reader understands
        (
            {"applied_at": 5, "kind": "gpu_xid", "node": "node1", "later": 1},
            FaultInjected(applied_at=5.0, kind="gpu_xid", node="node1"),
        ),
    ],
)
def test_readers_find_a_fault_only_in_an_output_that_names_when_it_applied(
    output: object, found: FaultInjected | None
) -> None:
    record = ActivityRecord.model_validate(
        {"name": "a", "type": "action", "phase": "method", "start": 1.0, "output": output}
    )
    assert record.fault_injected() == found


def test_the_journal_model_needs_nothing_of_the_runner() -> None:
    """A shared post-mortem package must be able to read journals through this module."""
    tree = ast.parse(Path(journal_module.__file__).read_text())
    imported = {
        node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    ours = {m for m in imported if m.startswith("stormwatch")}
    # Only the fault ledger's row model (a shared contract too) and the fault kinds.
    assert all(m.startswith(("stormwatch.contracts.", "stormwatch.faults")) for m in ours), ours
    assert not any(m.startswith("opentelemetry") for m in imported), imported
