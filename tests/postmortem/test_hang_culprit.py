"""The culprit of a hang in progress from the dumps its ranks were asked for
(:func:`stormwatch.postmortem.culprit_from_dumps`, the node agent's hang diagnosis)."""

from __future__ import annotations

import pytest

from stormwatch.postmortem import Clues, FirstAlert, RankDump, culprit_from_dumps, find_culprit
from stormwatch.telemetry.culprit import reduce_dump
from stormwatch.telemetry.dump import DumpRecord


def _dump(rank: int, enqueued: int, *, waiting: bool) -> RankDump:
    return RankDump(rank=rank, enqueued={"0 default_pg": enqueued}, in_flight=waiting)


@pytest.mark.parametrize(
    ("dumps", "asked", "expected"),
    [
        # every rank answered: the one behind and inside no collective never issued it
        ([_dump(0, 8, waiting=True), _dump(1, 7, waiting=False)], [0, 1], (1, True)),
        (
            [_dump(0, 8, waiting=True), _dump(1, 8, waiting=True), _dump(2, 7, waiting=False)],
            [0, 1, 2],
            (2, True),
        ),
        # one rank silent (stopped) while every rank that answered waits in a collective
        ([_dump(0, 8, waiting=True)], [0, 1], (1, True)),
        ([_dump(0, 8, waiting=True), _dump(2, 8, waiting=True)], [0, 1, 2], (1, True)),
        # two silent: neither can be told from the other
        ([_dump(0, 8, waiting=True)], [0, 1, 2], (None, False)),
        # a silent rank, but one that answered is behind and not waiting: that one
        ([_dump(0, 8, waiting=True), _dump(1, 7, waiting=False)], [0, 1, 2], (1, False)),
    ],
)
def test_the_rank_the_others_wait_for_is_named(
    dumps: list[RankDump], asked: list[int], expected: tuple[int | None, bool]
) -> None:
    culprit = culprit_from_dumps(dumps, asked)
    assert culprit is not None and culprit.method == "flight_recorder"
    assert (culprit.rank, culprit.certain) == expected, culprit.evidence


def test_ranks_that_all_answer_and_all_wait_name_no_one_here() -> None:
    # the culprit runs on another node: this node's ranks all wait and all answer
    waiting = [_dump(0, 8, waiting=True), _dump(1, 8, waiting=True)]
    assert culprit_from_dumps(waiting, [0, 1]) is None
    assert culprit_from_dumps([], [0, 1]) is None  # nobody answered: nothing to compare


def test_the_evidence_says_who_was_silent_and_who_waits() -> None:
    culprit = culprit_from_dumps([_dump(0, 8, waiting=True)], [0, 1])
    assert culprit is not None
    assert culprit.evidence[0].startswith(
        "rank(s) 1 did not answer the dump request, while rank(s) 0"
    )
    assert "group 0 default_pg: last enqueued #8" in culprit.evidence[1]


def _gloo_dump(rank: int, enqueued: int, completed: int) -> RankDump:
    """A rank's dump reduced as the agent reduces it, from torch's flight-recorder counters
    of one process group, ``"0"``."""
    return _fr_dump(rank, {"0": (enqueued, completed)})


def _fr_dump(
    rank: int, groups: dict[str, tuple[int, int]], names: dict[str, str] | None = None
) -> RankDump:
    """The same with several groups: pg_status index -> (last enqueued, last completed);
    ``names``: index -> the group's name, given by a ring entry (index "0" is the default
    group without one)."""
    status = {
        index: {"last_enqueued_collective": str(e), "last_completed_collective": str(c)}
        for index, (e, c) in groups.items()
    }
    entries = [
        {"pg_id": int(index), "process_group": [name, "mesh"]}
        for index, name in (names or {}).items()
    ]
    record = DumpRecord.model_validate(
        {
            "rank": rank,
            "time": 10.0,
            "reason": "dump requested: hang of job j",
            "flight_recorder": {"pg_status": status, "entries": entries},
        }
    )
    return reduce_dump(record)


def test_fc10_cc14_a_rank_behind_inside_a_collective_a_peer_completed_is_a_victim() -> None:
    """CI cc14: rank 1 (node0) SIGSTOPped inside a gloo ring all-reduce; on node1, rank 2
    had completed it (the ring brought it every chunk before rank 1 stopped) and waited in
    the next, rank 3 still waited in it. Node1's agent named rank 3, a waiting rank."""
    node1 = [_gloo_dump(2, enqueued=41, completed=40), _gloo_dump(3, enqueued=40, completed=39)]
    assert culprit_from_dumps(node1, [2, 3]) is None
    assert [d.overtaken for d in node1] == [[], ["default_pg:0"]]
    # Behind and inside no collective of that group is still the one that never issued it.
    hung = [_gloo_dump(2, enqueued=41, completed=40), _gloo_dump(3, enqueued=40, completed=40)]
    culprit = culprit_from_dumps(hung, [2, 3])
    assert culprit is not None and (culprit.rank, culprit.certain) == (3, True)
    assert "group default_pg:0: 1 fewer" in culprit.evidence[2]


@pytest.mark.parametrize(
    ("enqueued", "completed", "expected", "marked"),
    [
        # NCCL: rank 1's kernel #40 never ran (its GPU is stuck before it) while its peers
        # enqueued #41 behind #40; nobody completed #40: rank 1 is the likely culprit.
        ((41, 40, 41), (39, 39, 39), (1, False), ""),
        # rank 0 completed #40 (a ring), rank 1 is left inside it, rank 2 never issued #41
        (
            (41, 40, 40),
            (40, 39, 40),
            (2, True),
            "group default_pg:0: 1 fewer (inside a collective a peer completed)",
        ),
    ],
)
def test_fc10_a_rank_behind_inside_a_collective_is_named_only_when_no_peer_completed_it(
    enqueued: tuple[int, int, int],
    completed: tuple[int, int, int],
    expected: tuple[int, bool],
    marked: str,
) -> None:
    dumps = [_gloo_dump(r, enqueued=enqueued[r], completed=completed[r]) for r in range(3)]
    culprit = culprit_from_dumps(dumps, [0, 1, 2])
    assert culprit is not None and (culprit.rank, culprit.certain) == expected
    assert marked in culprit.evidence[2]


def test_fc10_a_silent_rank_is_named_when_the_answers_name_no_one() -> None:
    # Rank 1 stopped midway through a ring all-reduce: rank 0 completed it and is between
    # collectives, rank 2 is still inside it. Only the silent rank is left to name.
    dumps = [_gloo_dump(0, enqueued=41, completed=41), _gloo_dump(2, enqueued=40, completed=39)]
    culprit = culprit_from_dumps(dumps, [0, 1, 2])
    assert culprit is not None and (culprit.rank, culprit.certain) == (1, False)
    assert "the dumps of rank(s) 0, 2 name no one" in culprit.evidence[0]


def test_fc10_a_rank_waiting_in_one_group_and_behind_on_another_is_a_victim() -> None:
    """The game day's hung rank (2026-12-05 10:01, dp=2 x tp=2, rank 1 on node0 blocked):
    node1's rank 3 waited in its data-parallel all-reduce with rank 1 (group "1") and so was
    one behind rank 2 on their tensor-parallel group ("2"), where rank 2 waited for it.
    Node1's agent named rank 3 (uncertain): a waiting rank. Group names are the ranks' own
    (rank 2's "1" is the other data-parallel group)."""
    names2, names3 = {"1": "1", "2": "4"}, {"1": "2", "2": "4"}  # dp [0, 2], [1, 3]; tp [2, 3]
    rank2 = _fr_dump(2, {"0": (34, 34), "1": (136, 136), "2": (181, 180)}, names2)
    rank3 = _fr_dump(3, {"0": (34, 34), "1": (136, 135), "2": (180, 180)}, names3)
    assert culprit_from_dumps([rank2, rank3], [2, 3]) is None
    # Inside no collective at all, the same lag names it: it never issued the next one.
    idle = _fr_dump(3, {"0": (34, 34), "1": (136, 136), "2": (180, 180)}, names3)
    culprit = culprit_from_dumps(
        [_fr_dump(2, {"0": (34, 34), "1": (136, 136), "2": (181, 180)}, names2), idle], [2, 3]
    )
    assert culprit is not None and (culprit.rank, culprit.certain) == (3, True)


@pytest.mark.parametrize("odd", ["--5", "²", "9" * 5000, "1e3", " 7"])
def test_fc10_odd_counters_and_rank_labels_are_ignored_not_raised(odd: str) -> None:
    """The agent's hang thread reduces whatever a dump holds: a counter `int()` refuses
    (isdigit() accepted "--5" and "²") is no counter, and an alert's odd rank label no rank."""
    record = DumpRecord.model_validate(
        {
            "rank": 0,
            "flight_recorder": {
                "pg_status": {
                    "0": {"last_enqueued_collective": odd, "last_completed_collective": "1"}
                }
            },
        }
    )
    assert reduce_dump(record).enqueued == {}
    clues = Clues(
        progress={},
        dumps=[],
        first_alert=FirstAlert(alertname="StormwatchRankStalled", labels={"rank": odd}),
        first_alert_at=0.0,
        straggler_scores={f"rank={odd}": 2.0},
    )
    assert find_culprit(clues).rank is None


def _recorded_dump(rank: int, groups: dict[int, tuple[str, str, int, int]]) -> RankDump:
    """A dump in torch's own shape (2.13, gloo, captured from a dp=2 x tp=2 mesh):
    ``pg_status`` keyed by this rank's group index, and ring entries carrying each index's
    ``pg_id`` with the group's ``process_group: [name, desc]``.
    ``groups``: index -> (name, desc, last enqueued, last completed)."""
    status = {
        str(index): {"last_enqueued_collective": str(e), "last_completed_collective": str(c)}
        for index, (_, _, e, c) in groups.items()
    }
    entries = [
        {"pg_id": index, "process_group": [name, desc], "collective_seq_id": e}
        for index, (name, desc, e, _) in groups.items()
    ]
    record = DumpRecord.model_validate(
        {"rank": rank, "flight_recorder": {"pg_status": status, "entries": entries}}
    )
    return reduce_dump(record)


def test_fc10_groups_are_compared_by_name_not_by_each_ranks_own_index() -> None:
    """Rank 2's group index 1 is data-parallel group "1" (ranks 0, 2); rank 3's index 1 is
    group "2" (ranks 1, 3): another group, whose counts say nothing about rank 2's. Compared
    by index (before), rank 3 was "behind" on "1" while inside no collective: named."""
    rank2 = _recorded_dump(
        2,
        {
            0: ("0", "default_pg", 5, 5),
            1: ("1", "mesh_dp", 137, 137),
            2: ("4", "mesh_tp", 181, 180),
        },
    )
    rank3 = _recorded_dump(
        3,
        {
            0: ("0", "default_pg", 5, 5),
            1: ("2", "mesh_dp", 136, 136),
            2: ("4", "mesh_tp", 181, 181),
        },
    )
    assert set(rank2.enqueued) == {"default_pg:0", "mesh_dp:1", "mesh_tp:4"}
    assert set(rank3.enqueued) == {"default_pg:0", "mesh_dp:2", "mesh_tp:4"}
    assert culprit_from_dumps([rank2, rank3], [2, 3]) is None
    # The same counts on one shared group: rank 3 never issued #137 there.
    shared = _recorded_dump(
        3,
        {
            0: ("0", "default_pg", 5, 5),
            1: ("1", "mesh_dp", 136, 136),
            2: ("4", "mesh_tp", 181, 181),
        },
    )
    culprit = culprit_from_dumps([rank2, shared], [2, 3])
    assert culprit is not None and (culprit.rank, culprit.certain) == (3, True)
    assert "group mesh_dp:1: 1 fewer" in culprit.evidence[2]


def test_fc10_a_group_whose_entries_left_the_ring_is_never_compared_across_ranks() -> None:
    """A real gloo dump (TORCH_FR_BUFFER_SIZE=8, dp=2 x tp=2, every collective completed):
    the data-parallel groups [0, 2] (3 all-reduces) and [1, 3] (1) are index "2" on every
    rank and their entries had left the ring. Compared by that index, rank 1 was "2 behind"
    and node 0's diagnosis named it, certain, with no rank hung (breaker pass)."""

    def record(rank: int, dp_calls: int) -> DumpRecord:
        done = {"last_enqueued_collective": "12", "last_completed_collective": "12"}
        dp = {"last_enqueued_collective": str(dp_calls), "last_completed_collective": str(dp_calls)}
        return DumpRecord.model_validate(
            {
                "rank": rank,
                "flight_recorder": {
                    "pg_status": {"1": done, "2": dp, "0": done},
                    "entries": [{"pg_id": 1, "process_group": ["1", "mesh_tp"]}],
                },
            }
        )

    zero, one = record(0, 3), record(1, 1)
    assert set(zero.group_status()) == {"mesh_tp:1", "rank0/pg2", "default_pg:0"}
    assert set(one.group_status()) == {"mesh_tp:1", "rank1/pg2", "default_pg:0"}
    assert culprit_from_dumps([reduce_dump(zero), reduce_dump(one)], [0, 1]) is None
    # Waiting inside such a group's collective still counts as waiting.
    waiting = DumpRecord.model_validate(
        {
            "rank": 1,
            "flight_recorder": {
                "pg_status": {
                    "2": {"last_enqueued_collective": "2", "last_completed_collective": "1"}
                },
                "entries": ["odd", {"pg_id": 1}, {"pg_id": 3, "process_group": "x"}],
            },
        }
    )
    assert reduce_dump(waiting).in_flight


def test_straggler_scores_beside_another_culprit_say_what_they_are() -> None:
    """Fresh-user pass: four scores above 1.2 beside a killed rank read as four stragglers;
    they are each rank's highest in the window, a restart's slow steps included."""
    clues = Clues(
        progress={},
        dumps=[],
        first_alert=FirstAlert(alertname="StormwatchRankStalled", labels={"rank": "1"}),
        first_alert_at=0.0,
        straggler_scores={"rank=0": 1.38, "rank=1": 1.46},
    )
    found = find_culprit(clues)
    assert found.rank == 1 and found.method != "straggler"
    [line] = [e for e in found.evidence if e.startswith("straggler scores")]
    assert line.startswith("straggler scores (each rank's highest in the window; ")
    assert ">= 1.2 several steps in a row" in line
    assert line.endswith("): rank=0 1.38, rank=1 1.46")
