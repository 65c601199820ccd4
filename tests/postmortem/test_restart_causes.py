"""A restart's causes beside its culprit: the rank that failed on the node that caused it,
and a restart that failed because a port was taken ("port conflict on restart")."""

from __future__ import annotations

import dataclasses
import errno

from stormwatch.postmortem import (
    PORT_CONFLICT_ON_RESTART,
    IncidentPostMortem,
    RankDump,
    RankExit,
    RankProgress,
    StepDone,
    WorkerStart,
    failed_ranks,
    incident_document,
    measure_impact,
    render_markdown,
    restart_after,
    restart_failure,
)


def _restarted_by_node1() -> dict[int, RankProgress]:
    def marks(attempt: int) -> tuple[WorkerStart | StepDone, ...]:
        return (
            WorkerStart(time=1.0, attempt=0, job_attempt=0),
            StepDone(time=2.0, step=5, step_seconds=1.0),
            WorkerStart(
                time=10.0,
                attempt=attempt,
                resumed_from_step=4,
                job_attempt=1,
                restarted_by=("node1",),
            ),
            StepDone(time=11.0, step=5, attempt=attempt, step_seconds=1.0),
        )

    return {r: RankProgress(rank=r, marks=marks(1 if r >= 2 else 0)) for r in range(4)}


def test_the_restart_names_the_rank_that_failed_on_the_node_that_caused_it() -> None:
    """Rank 3 died on node1 at 5.0; torchrun then stopped rank 2 (its sibling) and node0's
    ranks restarted because their peer failed. Before, the restart named node1 only."""
    progress = _restarted_by_node1()
    restart = restart_after(progress, 4.0)
    exits = [
        RankExit(5.5, 2, "node1", "exited with code 143"),
        RankExit(5.0, 3, "node1", "was killed by SIGKILL"),
        RankExit(5.6, 0, "node0", "exited with code 143"),  # a peer node: not the cause
        RankExit(30.0, 1, "node0", "was killed by SIGKILL"),  # after the restart
    ]
    ranks = failed_ranks(restart, exits, since=4.0)
    assert ranks == {"node1": 3}
    expected = "restart 1 of the job (its nodes' torchrun counts: 0, 1); restarted by a failure on node1 (rank 3)"
    assert restart.counts(ranks) == expected
    impact = measure_impact(progress, restart, onset=4.0, resolved_at=None, failed_ranks=ranks)
    assert impact.restart == expected
    assert failed_ranks(restart_after(progress, 40.0), exits) == {}  # no restart: no cause


def test_a_rank_that_failed_after_the_first_is_named_after_it_not_beside_it() -> None:
    """Both torchrun agents name their node (``make demo``): rank 1 was killed on node0 and
    rank 3 on node1 exited 0.4 s later, its collectives broken. The restart line used to read
    "a failure on node0 (rank 1), node1 (rank 3)", two causes; it now says which came first,
    whatever order the start lists the nodes in."""
    start = WorkerStart(
        time=10.0, attempt=1, resumed_from_step=4, job_attempt=1, restarted_by=("node1", "node0")
    )
    progress = {
        r: RankProgress(rank=r, marks=(WorkerStart(time=1.0, attempt=0, job_attempt=0), start))
        for r in range(4)
    }
    restart = restart_after(progress, 4.0)
    exits = [
        RankExit(5.4, 3, "node1", "exited with code 1"),
        RankExit(5.0, 1, "node0", "was killed by SIGKILL"),
        RankExit(5.5, 0, "node0", "exited with code 143"),  # stopped for the restart
    ]
    ranks = failed_ranks(restart, exits, since=4.0)
    assert list(ranks.items()) == [("node0", 1), ("node1", 3)]  # in the order they failed
    assert restart.counts(ranks) == (
        "restart 1 of the job (its nodes' torchrun counts: 1); "
        "restarted by a failure on node0 (rank 1), followed by node1 (rank 3)"
    )
    # a node the start names without an exit seen there still follows
    assert restart.counts({"node0": 1}) == (
        "restart 1 of the job (its nodes' torchrun counts: 1); "
        "restarted by a failure on node0 (rank 1), followed by node1"
    )


def test_a_dump_with_errno_eaddrinuse_after_the_onset_is_a_port_conflict_on_restart() -> None:
    conflict = RankDump(
        rank=0, attempt=1, time=12.0, phase="rendezvous", errno=errno.EADDRINUSE,
        reason="DistNetworkError: The server socket has failed to listen",
    )  # fmt: skip
    other = RankDump(rank=1, attempt=1, time=12.5, errno=errno.ECONNREFUSED, reason="refused")
    failure = restart_failure([other, conflict], since=10.0)
    assert failure is not None and failure.cause == PORT_CONFLICT_ON_RESTART
    assert failure.ranks == [0]
    assert "errno 98 (EADDRINUSE)" in failure.evidence[0] and "rendezvous" in failure.evidence[0]
    assert restart_failure([conflict], since=20.0) is None  # before the incident: not its restart


def test_without_restarted_by_only_the_earliest_unclean_exit_is_the_cause() -> None:
    """A trainer older than ``restarted_by``: the ranks torchrun stopped on the other node
    (code 143) exited because of the restart and are not named as its cause."""
    progress = {
        r: dataclasses.replace(
            p,
            marks=tuple(
                dataclasses.replace(m, restarted_by=()) if isinstance(m, WorkerStart) else m
                for m in p.marks
            ),
        )
        for r, p in _restarted_by_node1().items()
    }
    restart = restart_after(progress, 4.0)
    exits = [
        RankExit(5.6, 0, "node0", "exited with code 143"),
        RankExit(5.5, 2, "node1", "exited with code 143"),
        RankExit(5.0, 3, "node1", "was killed by SIGKILL"),
    ]
    assert failed_ranks(restart, exits, since=4.0) == {"node1": 3}
    tied = [RankExit(5.0, 3, "node1", "killed"), RankExit(5.0, 1, "node0", "killed")]
    assert failed_ranks(restart, tied, since=4.0) == {"node0": 1}  # equal times: lower rank


def test_a_port_conflict_is_told_by_its_errno_not_by_the_words_of_its_message() -> None:
    """A reason that says "Address Already In Use" without the errno is not taken for one
    (the message is the exception's to word), and any casing of it with the errno is."""
    worded = RankDump(rank=0, time=12.0, reason="OSError: [Errno 98] ADDRESS ALREADY IN USE")
    assert restart_failure([worded], since=0.0) is None
    worded.errno = errno.EADDRINUSE
    assert restart_failure([worded], since=0.0) is not None


def test_the_incident_post_mortem_reports_a_port_conflict_on_restart_as_its_own_cause() -> None:
    dump = RankDump(rank=0, attempt=1, time=12.0, errno=errno.EADDRINUSE, reason="bind")
    pm = IncidentPostMortem(
        incident_id=7, alertname="StormwatchRankStalled", job="j", group_key="g",
        status="closed", detected_at=11.0, received_at=11.5,
        restart_failure=restart_failure([dump], since=10.0),
    )  # fmt: skip
    text = render_markdown(incident_document(pm))
    assert "| restart failure | port conflict on restart |" in text
    assert "## Restart failed: port conflict on restart" in text
    assert "could not bind a port" in text
