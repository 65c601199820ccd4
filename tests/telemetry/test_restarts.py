"""The job attempt's agreement (:mod:`stormwatch.telemetry.restarts`), rank by rank with a
real node memory folder; the all-gather is replaced by the list every rank would get."""

from __future__ import annotations

from pathlib import Path

from stormwatch.telemetry.restarts import NodeReport, agree_job_attempt, remember


def _round(folder: Path, counts: dict[str, int], job: str = "j") -> dict[str, object]:
    """One rendezvous round: every node's rank reports, all agree; node -> agreed."""
    reports = []
    for node, restarts in counts.items():
        attempt, remembered = remember(folder, node, job)
        reports.append(
            NodeReport(
                node=node,
                key=node,
                node_restarts=restarts,
                remembered_attempt=attempt,
                remembered_restarts=remembered,
            )
        )
    return {
        node: agree_job_attempt(
            job=job,
            node_restarts=restarts,
            folder=folder,
            environ={"STORMWATCH_NODE": node},
            gather=lambda mine: reports,
        )
        for node, restarts in counts.items()
    }


def test_restarts_alternating_between_nodes_count_once_each_for_the_job(tmp_path: Path) -> None:
    rounds = [{"a": 0, "b": 0}, {"a": 1, "b": 0}, {"a": 1, "b": 1}, {"a": 2, "b": 1}]
    agreed = [_round(tmp_path, counts) for counts in rounds]
    assert [[r[n].attempt for n in ("a", "b")] for r in agreed] == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert [r["b"].failed_nodes for r in agreed] == [(), ("a",), ("b",), ("a",)]
    assert agreed[2]["b"].node_counts == {"a": 1, "b": 1}


def test_both_nodes_failing_in_one_round_is_one_restart(tmp_path: Path) -> None:
    _round(tmp_path, {"a": 0, "b": 0})
    agreed = _round(tmp_path, {"a": 1, "b": 1})
    assert agreed["a"].attempt == 1 and agreed["a"].failed_nodes == ("a", "b")


def test_a_fresh_job_of_the_same_name_starts_at_attempt_zero(tmp_path: Path) -> None:
    for counts in ({"a": 0}, {"a": 1}, {"a": 2}):
        _round(tmp_path, counts)
    assert _round(tmp_path, {"a": 0})["a"].attempt == 0
    assert _round(tmp_path, {"a": 1})["a"].attempt == 1


def test_without_memory_the_attempt_is_the_highest_node_count() -> None:
    mine = NodeReport(node="a", key="a", node_restarts=1)
    peer = NodeReport(node="b", key="b", node_restarts=2)
    agreed = agree_job_attempt(
        job="j",
        node_restarts=1,
        folder=None,
        environ={"STORMWATCH_NODE": "a"},
        gather=lambda _: [mine, peer],
    )
    assert (agreed.attempt, agreed.agreed, agreed.node_restarts) == (2, False, 1)
