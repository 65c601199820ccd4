"""A hang before the first step is named by the start-up stage it was stuck in.

The node agents' ``rank_hang`` events carry the phase a rank was in past its deadline
(``rendezvous``, ``mesh``, ``parallelize``, ``checkpoint_load`` before the first step),
the ranks' dumps the phase they were in when they dumped; the post-mortem names the
culprit's stage (else the first one named) in the culprit, its evidence, the summary row
and the summary sentence.
"""

from __future__ import annotations

import pytest

from stormwatch.postmortem import (
    Clues,
    FirstAlert,
    IncidentPostMortem,
    RankDump,
    RankHang,
    find_culprit,
)
from stormwatch.postmortem.experiment import EXPERIMENT_ALERT_KEYS
from stormwatch.postmortem.incident import summary_rows
from stormwatch.postmortem.text import alert_label

AT = 1000.0


def _clues(hangs: list[RankHang], dumps: list[RankDump]) -> Clues:
    return Clues(
        progress={},  # no rank ever stepped
        dumps=dumps,
        first_alert=FirstAlert("StormwatchRankHungInPhase", {"training_job": "j", "rank": "1"}),
        first_alert_at=AT + 5,
        rank_hangs=hangs,
    )


@pytest.mark.parametrize("stage", ["rendezvous", "mesh", "parallelize", "checkpoint_load"])
def test_the_culprits_hang_event_names_its_start_up_stage(stage: str) -> None:
    hangs = [
        RankHang(AT, 0, "node0", "checkpoint_load"),  # a peer waiting further on
        RankHang(AT + 1, 1, "node1", stage),
    ]
    culprit = find_culprit(_clues(hangs, []))
    assert culprit.rank == 1 and culprit.phase == stage
    assert f"rank 1 hung in start-up stage {stage}, past its bound" in culprit.evidence[-1]
    pm = IncidentPostMortem(
        incident_id=1,
        alertname="StormwatchRankHungInPhase",
        group_key="k",
        status="closed",
        detected_at=AT,
        received_at=AT,
        culprit=culprit,
    )
    assert ("hung in (phase or start-up stage)", stage) in summary_rows(pm)


def test_without_hang_events_the_dumps_name_the_stage() -> None:
    dumps = [
        RankDump(rank=0, reason="Terminated", phase="checkpoint_load"),
        RankDump(rank=1, reason="Terminated", phase="mesh"),
    ]
    culprit = find_culprit(_clues([], dumps))
    assert culprit.rank == 1  # the first alert names it
    assert culprit.phase == "mesh"
    assert "rank 1's dump: it was in start-up stage mesh" in culprit.evidence


def test_a_hang_in_no_phase_names_none() -> None:
    culprit = find_culprit(_clues([RankHang(AT, 1, "node1", None)], [RankDump(rank=1)]))
    assert culprit.phase is None
    assert not any("stage" in line for line in culprit.evidence)


def test_both_post_mortems_show_the_stage_label_of_the_hang_alert() -> None:
    labels = {
        "training_job": "j",
        "job": "stormwatch-agent",  # Prometheus's scrape job: not printed
        "rank": "1",
        "phase": "mesh",
        "severity": "critical",
        "node": "n1",
    }
    incident = alert_label("StormwatchRankHungInPhase", labels)
    experiment = alert_label("StormwatchRankHungInPhase", labels, EXPERIMENT_ALERT_KEYS)
    assert (
        incident
        == "StormwatchRankHungInPhase{training_job=j, rank=1, node=n1, phase=mesh, severity=critical}"
    )
    assert (
        experiment
        == "StormwatchRankHungInPhase{training_job=j, rank=1, phase=mesh, severity=critical}"
    )
