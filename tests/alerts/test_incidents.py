"""One incident per Alertmanager alert group, over the real responder's HTTP API.

Each case replays a sequence of webhook notifications of one alert group
(``StormwatchRankStalled`` of one job, as Alertmanager groups them) and checks
the incidents that result. A step is written as alerts like ``F1@0`` (rank 1
firing, ``startsAt`` t0 + 0 s) or ``R1@0`` (rank 1's occurrence that started at
t0 + 0 s, resolved at its start + 20 s), plus what the notification changed:
(opened, joined, closed, actions started). An expected incident is its status,
its members in first-alert order (``1F`` = rank 1 firing, ``0R`` = rank 0
resolved) and its number of actions.

All cases share one responder; each uses its own group key and fingerprints.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import pytest

RESOLVE_AFTER_S = 20.0


@dataclass(frozen=True)
class Step:
    alerts: str
    changes: tuple[int, int, int, int] | None = None  # opened, joined, closed, actions started


@dataclass(frozen=True)
class Expect:
    status: str
    members: str
    actions: int = 1
    tied: bool = False


@dataclass(frozen=True)
class Case:
    steps: tuple[Step, ...]
    incidents: tuple[Expect, ...]


CASES = {
    # The lab's SIGKILL of one rank: torchrun stops the siblings too, all four alert
    # in the same rule evaluation and arrive in one notification.
    "four ranks in one notification are one incident with one action": Case(
        (Step("F0@0 F1@0 F2@0 F3@0", (1, 0, 0, 1)),),
        (Expect("open", "0F 1F 2F 3F", tied=True),),
    ),
    "siblings alerting later join the culprit's incident": Case(
        (
            Step("F1@0", (1, 0, 0, 1)),
            Step("F1@0 F0@2 F2@2 F3@2", (0, 1, 0, 0)),
        ),
        (Expect("open", "1F 0F 2F 3F"),),
    ),
    "a member joining with an earlier startsAt becomes the first alert": Case(
        (
            Step("F3@5", (1, 0, 0, 1)),
            Step("F3@5 F2@1", (0, 1, 0, 0)),
        ),
        (Expect("open", "2F 3F"),),
    ),
    "equal startsAt: the lower rank is first, and the tie is flagged": Case(
        (Step("F10@0 F2@0 F1@3", (1, 0, 0, 1)),),
        (Expect("open", "2F 10F 1F", tied=True),),
    ),
    "partial resolve keeps the incident open": Case(
        (
            Step("F0@0 F1@0 F2@0 F3@0"),
            Step("R0@0 F1@0 R2@0 F3@0", (0, 0, 0, 0)),
        ),
        (Expect("open", "0R 1F 2R 3F", tied=True),),
    ),
    "resolving every member closes it": Case(
        (
            Step("F0@0 F1@1"),
            Step("R0@0 R1@1", (0, 0, 1, 0)),
        ),
        (Expect("closed", "0R 1R"),),
    ),
    "members resolving one notification at a time close it with the last": Case(
        (
            Step("F0@0 F1@1"),
            Step("R0@0 F1@1", (0, 0, 0, 0)),
            Step("R1@1", (0, 0, 1, 0)),
        ),
        (Expect("closed", "0R 1R"),),
    ),
    "a resolved notification for the group closes members it did not list": Case(
        (
            Step("F0@0 F1@1 F2@1"),
            Step("R1@1", (0, 0, 1, 0)),  # e.g. truncated alerts
        ),
        (Expect("closed", "0R 1R 2R"),),
    ),
    "a re-fire after the close opens a new incident with its own action": Case(
        (
            Step("F1@0"),
            Step("R1@0", (0, 0, 1, 0)),
            Step("F1@60 F0@61", (1, 0, 0, 1)),
        ),
        (Expect("closed", "1R"), Expect("open", "1F 0F")),
    ),
    "a member re-firing while the incident is open joins it again": Case(
        (
            Step("F0@0 F1@0"),
            Step("F0@0 R1@0", (0, 0, 0, 0)),
            Step("F0@0 F1@30", (0, 1, 0, 0)),
        ),
        (Expect("open", "0F 1R 1F", tied=True),),
    ),
    # FC-12: HA twins and retries resend old firings after the resolve.
    "an old firing resent after the close changes nothing": Case(
        (
            Step("F1@0 F0@1"),
            Step("R1@0 R0@1", (0, 0, 1, 0)),
            Step("F1@0 F0@1", (0, 0, 0, 0)),
            Step("F0@1", (0, 0, 0, 0)),
        ),
        (Expect("closed", "1R 0R"),),
    ),
    "resolved alerts whose firing was missed are one closed incident without actions": Case(
        (Step("R1@0 R2@0", (0, 0, 0, 0)),),
        (Expect("closed", "1R 2R", actions=0, tied=True),),
    ),
    "firing and unseen resolved alerts in one notification are one open incident": Case(
        (Step("R2@0 F1@1", (1, 0, 0, 1)),),
        (Expect("open", "2R 1F"),),
    ),
}


def _fingerprint(group: str, rank: str) -> str:
    return hashlib.sha256(f"{group}/{rank}".encode()).hexdigest()[:16]


def _notification(kit: Any, group: str, job: str, t0: float, spec: str) -> dict[str, Any]:
    alerts = []
    for item in spec.split():
        status, rest = item[0], item[1:]
        rank, offset = rest.split("@")
        starts_at = t0 + float(offset)
        alerts.append(
            kit.alert(
                status="firing" if status == "F" else "resolved",
                starts_at=starts_at,
                ends_at=starts_at + RESOLVE_AFTER_S if status == "R" else None,
                fingerprint=_fingerprint(group, rank),
                job=job,
                rank=rank,
            )
        )
    payload = kit.payload(*alerts, group_key=group)
    payload["groupLabels"] = {"alertname": "StormwatchRankStalled", "training_job": job}
    return payload


@pytest.mark.parametrize("name", list(CASES))
def test_incident_per_alert_group(module_responder: Any, kit: Any, name: str) -> None:
    case = CASES[name]
    job = f"job-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    group = f'{{}}:{{alertname="StormwatchRankStalled", training_job="{job}"}}'
    t0 = time.time() - 300
    for i, step in enumerate(case.steps):
        reply = module_responder.post(_notification(kit, group, job, t0, step.alerts))
        assert reply.status == 200, (i, reply.body)
        if step.changes is not None:
            keys = ("incidents_opened", "incidents_joined", "incidents_closed", "actions_started")
            changed = tuple(len(reply.body[k]) for k in keys)
            assert changed == step.changes, (i, step.alerts, reply.body)
        # A resend of the same notification (Alertmanager's retry) changes nothing.
        again = module_responder.post(_notification(kit, group, job, t0, step.alerts)).body
        assert again["new_alerts"] == 0 and again["actions_started"] == [], (i, again)
        assert again["incidents_opened"] == again["incidents_closed"] == [], (i, again)

    incidents = [i for i in module_responder.get("incidents") if i["group_key"] == group]
    actions = module_responder.get("actions")
    got = [
        Expect(
            status=i["status"],
            members=" ".join(
                m["labels"]["rank"] + ("F" if m["status"] == "firing" else "R")
                for m in i["members"]
            ),
            actions=sum(a["incident_id"] == i["id"] for a in actions),
            tied=i["first_alert_tied"],
        )
        for i in incidents
    ]
    assert got == list(case.incidents)

    for incident in incidents:
        members = incident["members"]
        assert incident["first_alert"] == members[0]
        assert incident["starts_at"] == members[0]["starts_at"]
        assert incident["group_labels"] == {
            "alertname": "StormwatchRankStalled",
            "training_job": job,
        }
        assert incident["alertname"] == "StormwatchRankStalled"
        # Labels are those every member shares: the job always, a rank only when alone.
        ranks = {m["labels"]["rank"] for m in members}
        assert incident["labels"]["training_job"] == job
        assert incident["labels"].get("rank") == (ranks.pop() if len(ranks) == 1 else None)
        assert all(m["group_key"] == group for m in members)
        if incident["status"] == "closed":
            assert all(m["resolved_at"] is not None for m in members)
            ends = [m["ends_at"] for m in members if m["ends_at"] is not None]
            assert incident["ends_at"] == max(ends)
            assert incident["closed_at"] >= incident["opened_at"]
        else:
            assert incident["ends_at"] is None and incident["closed_at"] is None


def test_an_alert_routed_into_two_groups_joins_only_the_first_incident(
    module_responder: Any, kit: Any
) -> None:
    """FC-12: one alert occurrence never opens (or joins) a second incident."""
    t = time.time() - 30
    fp = kit.fingerprint()
    first = module_responder.post(
        kit.payload(kit.alert(starts_at=t, fingerprint=fp), group_key=f"{{}}:{{{fp}-a}}")
    ).body
    second = module_responder.post(
        kit.payload(kit.alert(starts_at=t, fingerprint=fp), group_key=f"{{}}:{{{fp}-b}}")
    ).body
    assert len(first["incidents_opened"]) == 1 and len(first["actions_started"]) == 1
    assert second["new_alerts"] == 1 and second["incidents_opened"] == []
    # Its resolve, through either group, closes the incident it belongs to.
    resolved = module_responder.post(
        kit.payload(
            kit.alert(status="resolved", starts_at=t, ends_at=t + 5, fingerprint=fp),
            group_key=f"{{}}:{{{fp}-b}}",
        )
    ).body
    assert resolved["incidents_closed"] == first["incidents_opened"]


def test_actions_are_per_incident_even_with_several_alert_names(
    module_responder: Any, kit: Any
) -> None:
    """A group mixing alert names gets each action kind once, when its first alert joins."""
    t = time.time() - 30
    group = f"{{}}:{{{kit.fingerprint()}}}"
    other = kit.alert(starts_at=t, alertname="SomethingElse", fingerprint=kit.fingerprint())
    opened = module_responder.post(kit.payload(other, group_key=group)).body
    assert len(opened["incidents_opened"]) == 1 and opened["actions_started"] == []
    stalled = [
        kit.alert(starts_at=t + 1, rank=str(r), fingerprint=kit.fingerprint()) for r in (0, 1)
    ]
    joined = module_responder.post(kit.payload(other, *stalled, group_key=group)).body
    assert joined["incidents_joined"] == opened["incidents_opened"]
    assert len(joined["actions_started"]) == 1
    [incident] = [i for i in module_responder.get("incidents") if i["group_key"] == group]
    assert incident["alertname"] == "SomethingElse"
    assert incident["labels"] == {"training_job": "train", "severity": "critical"}
    assert [
        a["kind"] for a in module_responder.get("actions") if a["incident_id"] == incident["id"]
    ] == ["confirm_restart"]
