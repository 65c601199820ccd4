"""A hang's culprit when the dumps cannot be compared: the agents' diagnosis during the
hang counts, and rank exits caused by the responder's own restart are not the cause.

A hung rank's job is restarted by the responder (SIGTERM to every rank): the agents then
see every rank exit uncleanly. When the flight recorder cannot decide (a rank wrote no
dump), those exits must not name whichever rank happened to die first (the Lightning
hung-rank lab test named rank 3, the first to exit under the restart, instead of the
stalled rank 1).
"""

from __future__ import annotations

from stormwatch.postmortem import Clues, FirstAlert, HangDiagnosis, RankExit, find_culprit
from stormwatch.postmortem.progress import RankProgress, StepDone

HUNG_AT = 1000.0
RESTART_AT = HUNG_AT + 40


def _progress() -> dict[int, RankProgress]:
    """Ranks 0, 2, 3 completed step 7; rank 1 stalled before it (its last step is 6)."""
    return {
        rank: RankProgress(
            rank=rank,
            marks=tuple(
                StepDone(time=HUNG_AT - 8 + s, step=s) for s in range(1, 7 if rank == 1 else 8)
            ),
        )
        for rank in range(4)
    }


def _clues(*, stopped_at: float | None) -> Clues:
    exits = [  # the restart's SIGTERM: rank 3 happened to go first
        RankExit(RESTART_AT + 0.2 + 0.1 * i, rank, f"node{rank // 2}", "exited with code 143")
        for i, rank in enumerate((3, 0, 2, 1))
    ]
    return Clues(
        progress=_progress(),
        dumps=(),  # no dump to compare
        first_alert=FirstAlert("StormwatchTrainingHung", {"training_job": "pl-hang"}),
        first_alert_at=HUNG_AT + 30,
        onset=HUNG_AT,
        rank_exits=exits,
        stopped_at=stopped_at,
    )


def test_exits_after_the_responder_began_its_restart_do_not_name_the_culprit() -> None:
    culprit = find_culprit(_clues(stopped_at=RESTART_AT))
    assert (culprit.rank, culprit.method) == (1, "heartbeat"), culprit.evidence


def test_without_a_restart_the_first_exit_still_names_the_culprit() -> None:
    culprit = find_culprit(_clues(stopped_at=None))
    assert (culprit.rank, culprit.method) == (3, "rank_exit"), culprit.evidence


def test_an_exit_before_the_restart_still_names_the_culprit() -> None:
    clues = _clues(stopped_at=RESTART_AT)
    early = RankExit(HUNG_AT + 1, 2, "node1", "was killed by SIGKILL")
    clues = Clues(**{**clues.__dict__, "rank_exits": [early, *clues.rank_exits]})
    culprit = find_culprit(clues)
    assert (culprit.rank, culprit.method) == (2, "rank_exit"), culprit.evidence


def test_the_agents_diagnosis_during_the_hang_names_the_rank_when_dumps_are_missing() -> None:
    clues = _clues(stopped_at=None)  # even before the restart's exits are set aside
    seen = HangDiagnosis(HUNG_AT + 32, 1, "node0", True, ("rank 1 never issued ...",))
    idle = HangDiagnosis(HUNG_AT + 33, 1, "node1", False, ("rank(s) 1 did not answer",))
    clues = Clues(**{**clues.__dict__, "hang_diagnoses": [seen, idle]})
    culprit = find_culprit(clues)
    assert (culprit.rank, culprit.node, culprit.method) == (1, "node0", "flight_recorder")
    assert culprit.certain and "agent on node0" in culprit.evidence[0], culprit.evidence


def test_agents_that_disagree_leave_the_diagnosis_uncertain() -> None:
    clues = _clues(stopped_at=RESTART_AT)
    a = HangDiagnosis(HUNG_AT + 32, 1, "node0", True)
    b = HangDiagnosis(HUNG_AT + 32, 2, "node1", True)
    culprit = find_culprit(Clues(**{**clues.__dict__, "hang_diagnoses": [a, b]}))
    assert (culprit.rank, culprit.certain) == (1, False), culprit.evidence


def test_an_exit_the_agent_classified_as_a_stop_does_not_make_the_killed_rank_uncertain() -> None:
    """`make demo` (fresh-user pass, 2026-12-05): rank 1 SIGKILLed, then torchrun stopped
    rank 0 0.47 s later (the agent: ``reason="stopped"``); the post-mortem called rank 1
    "uncertain" because both exits fell inside the tie window."""
    from stormwatch.agent.watch.events import RankExitEvent
    from stormwatch.alerts.incident_report.clues import culprit_exits

    killed = RankExitEvent(
        time=HUNG_AT, node="node0", job="j", rank=1, clean=False, exit_code=-9,
        exit_signal="SIGKILL", reason="signal",
    )  # fmt: skip
    stopped = RankExitEvent(
        time=HUNG_AT + 0.47, node="node0", job="j", rank=0, clean=False, exit_code=-15,
        exit_signal="SIGTERM", reason="stopped",
    )  # fmt: skip
    exits = culprit_exits([killed, stopped])
    assert [e.rank for e in exits] == [1]
    clues = _stalled_rank_1(exits)
    culprit = find_culprit(clues)
    assert (culprit.rank, culprit.method, culprit.certain) == (1, "rank_exit", True)
    # the same two exits, both counted (the old filter): uncertain
    both = Clues(**{**clues.__dict__, "rank_exits": [
        RankExit(e.time, e.rank, e.node, "x") for e in (killed, stopped)
    ]})  # fmt: skip
    assert find_culprit(both).certain is False


def test_peers_that_ended_themselves_after_a_killed_rank_are_its_victims() -> None:
    """`make demo` again: rank 3 exited with code 1 0.77 s after rank 1's SIGKILL (its gloo
    collective failed), inside the tie window; the killed rank is the culprit, certain.
    Two ranks killed within a second stay uncertain."""
    from stormwatch.agent.watch.events import RankExitEvent
    from stormwatch.alerts.incident_report.clues import culprit_exits

    killed = RankExitEvent(
        time=HUNG_AT, node="node0", job="j", rank=1, clean=False, exit_code=-9,
        exit_signal="SIGKILL", reason="signal",
    )  # fmt: skip
    victim = RankExitEvent(
        time=HUNG_AT + 0.77, node="node1", job="j", rank=3, clean=False, exit_code=1,
        reason="exit_code",
    )  # fmt: skip
    exits = culprit_exits([killed, victim])
    assert [(e.rank, e.killed) for e in exits] == [(1, True), (3, False)]
    clues = _stalled_rank_1(exits)
    culprit = find_culprit(clues)
    assert (culprit.rank, culprit.method, culprit.certain) == (1, "rank_exit", True)
    assert (
        "rank 1 was killed; rank 3, which exited within a second after it, ended itself "
        "(its collectives failed)"
    ) in culprit.evidence
    both_killed = Clues(**{**clues.__dict__, "rank_exits": [
        exits[0], RankExit(HUNG_AT + 0.77, 3, "node1", "was killed by SIGKILL", killed=True),
    ]})  # fmt: skip
    assert find_culprit(both_killed).certain is False


def _stalled_rank_1(exits: list[RankExit]) -> Clues:
    """RankStalled about rank 1 at the onset, with only these exits as clues."""
    return Clues(
        progress=_progress(),
        dumps=(),
        first_alert=FirstAlert("StormwatchRankStalled", {"training_job": "j", "rank": "1"}),
        first_alert_at=HUNG_AT + 1,
        onset=HUNG_AT,
        rank_exits=exits,
    )
