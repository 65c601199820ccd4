"""A hang's culprit when the dumps cannot be compared: the agents' diagnosis during the
hang counts, and rank exits caused by the responder's own restart are not the cause.

A hung rank's job is restarted by the responder (SIGTERM to every rank): the agents then
see every rank exit uncleanly. When the flight recorder cannot decide (a rank wrote no
dump), those exits must not name whichever rank happened to die first (the Lightning
hung-rank lab test named rank 3, the first to exit under the restart, instead of the
stalled rank 1).
"""

from __future__ import annotations

import copy

from stormwatch.postmortem import (
    DUMP_LEAD_S,
    Clues,
    FirstAlert,
    HangDiagnosis,
    RankDump,
    RankExit,
    compare_dumps,
    find_culprit,
    incident_dumps,
)
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


def _fr(rank: int, at: float, enqueued: int, *, waiting: bool, attempt: int = 0) -> RankDump:
    return RankDump(
        rank=rank, attempt=attempt, time=at, enqueued={"0 default_pg": enqueued}, in_flight=waiting
    )


#: What a Lightning job's ranks wrote around the responder's restart of rank 1's hang: the
#: answers to the agents' dump requests during the hang (rank 1 one collective behind and
#: inside none), then the restart's SIGTERM dumps, in which rank 1 is level with its peer
#: (Lightning's SIGTERM handler issued a broadcast on it), then a restarted attempt's.
DURING = [_fr(0, HUNG_AT + 31, 46, waiting=True), _fr(1, HUNG_AT + 31, 45, waiting=False)]
AT_STOP = [_fr(0, RESTART_AT + 0.1, 46, waiting=True), _fr(1, RESTART_AT + 0.1, 46, waiting=True)]
LATER = [_fr(0, RESTART_AT + 30, 3, waiting=True, attempt=1)]


def _named(dumps: list[RankDump]) -> tuple[int | None, str, bool]:
    two = {r: p for r, p in _progress().items() if r < 2}  # a 2-rank job, as the dumps'
    clues = _clues(stopped_at=RESTART_AT)
    clues = Clues(
        **{**clues.__dict__, "dumps": compare_dumps(copy.deepcopy(dumps)), "progress": two}
    )
    culprit = find_culprit(clues)
    return culprit.rank, culprit.method, culprit.certain


def test_fc10_the_dumps_taken_during_the_hang_name_it_not_those_the_restart_leveled() -> None:
    every = [*DURING, *AT_STOP, *LATER]
    chosen = incident_dumps(every, since=HUNG_AT - DUMP_LEAD_S, stopped_at=RESTART_AT)
    assert chosen == DURING
    assert _named(chosen) == (1, "flight_recorder", True)
    # each rank's latest, as the post-mortem read them before: a restarted attempt's dump
    # beside the stop's names the wrong rank, and the stop's alone name no one behind (the
    # heartbeat names rank 1 here only because this job's rank 1 stalled a step earlier)
    latest = incident_dumps(every, since=None, stopped_at=None)
    assert latest == [LATER[0], AT_STOP[1]]
    assert _named(latest)[:2] == (0, "flight_recorder")
    assert _named(AT_STOP)[1] != "flight_recorder"


def test_fc10_a_rank_with_no_dump_during_the_hang_gives_its_dump_at_the_stop_not_a_later_one() -> (
    None
):
    every = [DURING[1], *AT_STOP, *LATER]
    chosen = incident_dumps(every, since=HUNG_AT - DUMP_LEAD_S, stopped_at=RESTART_AT)
    assert chosen == [AT_STOP[0], DURING[1]]
    # a dump from before the window's bound does not stand in for one during the incident
    old = _fr(0, HUNG_AT - DUMP_LEAD_S - 1, 10, waiting=False)
    chosen = incident_dumps([old, *every], since=HUNG_AT - DUMP_LEAD_S, stopped_at=RESTART_AT)
    assert chosen == [AT_STOP[0], DURING[1]]
    # a rank whose only dump after the stop is a restarted attempt's is left out, not
    # compared with the hung attempt's (breaker: rank 0's 3 collectives named it behind)
    chosen = incident_dumps([DURING[1], *LATER], since=HUNG_AT, stopped_at=RESTART_AT)
    assert chosen == [DURING[1]]
    # only that old dump: it is still read (each rank's latest) rather than nothing
    assert incident_dumps([old], since=HUNG_AT, stopped_at=RESTART_AT) == [old]
