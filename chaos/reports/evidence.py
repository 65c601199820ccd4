"""Evidence for a post-mortem from the live services: alerts (Prometheus) and the responder.

Collected once into :class:`Evidence` and saved as
``<run>/experiments/<id>/evidence.json``, so the post-mortem can be rebuilt
later (or in a test) from recorded inputs only. A service that does not answer
leaves its part empty with the reason in ``*_error``; collection never raises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, model_validator

from stormwatch.chaos.errors import ChaosError
from stormwatch.clients import (
    AsyncPrometheusClient,
    PrometheusAPIError,
    ResponderClient,
    ResponderClientError,
)
from stormwatch.clients.http import HttpOptions
from stormwatch.contracts.responder import IncidentRecord, NotificationRecord
from stormwatch.errors import ConfigError

#: Resolution of the ALERTS range query (s): the lab evaluates rules every second.
ALERT_STEP_SECONDS = 1.0
#: Resolution of the rank placement query (s): a rank stays on its node for a worker's
#: life (tens of seconds at least), so a coarse step finds every placement cheaply.
PLACEMENT_STEP_SECONDS = 5.0
#: Which node ran which rank: every agent series carries its scrape target's ``node`` label.
PLACEMENT_QUERY = "count by (training_job, rank, node) (stormwatch_rank_up)"
#: Seconds per request to Prometheus and the responder: both are on this host, and a dead
#: service must not hold the post-mortem up.
SERVICE_TIMEOUT_SECONDS = 5.0


class AlertEvidence(BaseModel):
    """One alert series seen firing in Prometheus.

    Attributes:
        alertname / labels: the alert (``ALERTS`` labels without ``alertstate``).
        firing_at: when Prometheus fired it (Unix s): the ``startsAt`` Prometheus sent to
            Alertmanager, as the responder recorded it, when the responder has the alert
            (so that this and the responder's post-mortem give one time); otherwise the
            first ``ALERTS{alertstate="firing"}`` sample (up to one query step late), or
            ``activeAt``.
        resolved_at: the alert's ``endsAt`` from the responder, else just after the last
            firing sample when the series ended before the end of the query window;
            None while still firing.
        source: ``alertmanager``, ``query_range`` or ``alerts_api``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    alertname: str
    labels: dict[str, str]
    firing_at: float
    resolved_at: float | None = None
    source: str = "query_range"


class RankPlacement(BaseModel):
    """A rank of a job seen on a node (an agent exported ``stormwatch_rank_up`` for it)
    during the evidence window; a rank restarted elsewhere appears once per node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    training_job: str
    rank: int
    node: str


class Evidence(BaseModel):
    """What the services said about one experiment run.

    ``alerts`` holds every alert series that fired in the window, whatever job or node it
    names (the scorecard judges its culprit and false alarms from them); ``ranks`` which
    node ran which rank (:data:`PLACEMENT_QUERY`), to tell whether an alert naming a rank
    names a faulted node. Evidence saved before ``ranks`` existed loads with none.

    ``incidents`` and ``notifications`` are the responder's own records
    (:mod:`stormwatch.contracts.responder`). Evidence saved before the controller used them
    held a subset of their fields; it still loads (:func:`_complete_legacy_records` fills
    what it lacked from what it has), so an old run's post-mortem can be rebuilt.
    """

    model_config = ConfigDict(extra="forbid")

    collected_at: float = Field(default_factory=time.time)
    window_start: float
    window_end: float
    alerts: list[AlertEvidence] = Field(default_factory=list)
    ranks: list[RankPlacement] = Field(default_factory=list)
    prometheus_error: str | None = None
    incidents: list[IncidentRecord] = Field(default_factory=list)
    notifications: list[NotificationRecord] = Field(default_factory=list)
    responder_error: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        return _complete_legacy_records(data) if isinstance(data, dict) else data


def _complete_legacy_records(data: dict[str, Any]) -> dict[str, Any]:
    """Fill the record fields an older ``evidence.json`` did not save (no receiver,
    fingerprints, annotations, group labels or first alert): empty values, and times from
    the incident's own."""
    data = dict(data)
    data["notifications"] = [
        {"receiver": "", **n} if isinstance(n, dict) else n for n in data.get("notifications", [])
    ]
    data["incidents"] = [
        _legacy_incident(i) if isinstance(i, dict) and "first_alert" not in i else i
        for i in data.get("incidents", [])
    ]
    return data


def _legacy_incident(item: dict[str, Any]) -> dict[str, Any]:
    starts = item.get("starts_at", item.get("opened_at"))
    closed = item.get("closed_at")
    member_defaults = {
        "fingerprint": "",
        "alertname": item.get("alertname", ""),
        "status": "resolved" if closed is not None else "firing",
        "labels": item.get("labels", {}),
        "annotations": {},
        "group_key": item.get("group_key", ""),
        "ends_at": item.get("ends_at"),
        "joined_at": item.get("opened_at"),
        "resolved_at": closed,
    }
    members = [
        {**member_defaults, **m, "starts_at": m.get("starts_at") or starts}
        for m in item.get("members", [])
        if isinstance(m, dict)
    ] or [{**member_defaults, "starts_at": starts}]
    incident_defaults: dict[str, Any] = {
        "group_key": "",
        "group_labels": {},
        "labels": {},
        "annotations": {},
        "ends_at": None,
        "closed_at": None,
        "first_alert_tied": False,
    }
    return {
        **incident_defaults,
        **item,
        "starts_at": starts,
        "first_alert": members[0],
        "members": members,
    }


async def collect_evidence(
    *,
    window_start: float,
    prometheus_url: str | None,
    responder_url: str | None,
    responder_token_file: Path | None = None,
    prometheus_http: HttpOptions | None = None,
    session: aiohttp.ClientSession | None = None,
) -> Evidence:
    """Query Prometheus (``ALERTS`` over ``[window_start, now]``, ``/api/v1/alerts``, the
    ranks' nodes; reached with ``prometheus_http``, TLS and auth) and the responder."""
    if session is None:
        async with aiohttp.ClientSession() as own:
            return await collect_evidence(
                window_start=window_start,
                prometheus_url=prometheus_url,
                prometheus_http=prometheus_http,
                responder_url=responder_url,
                responder_token_file=responder_token_file,
                session=own,
            )
    end = time.time()
    evidence = Evidence(window_start=window_start, window_end=end)
    if prometheus_url is None:
        evidence.prometheus_error = "no Prometheus URL"
    else:
        try:
            client = AsyncPrometheusClient(
                prometheus_url,
                timeout=SERVICE_TIMEOUT_SECONDS,
                options=prometheus_http,
                session=session,
            )
            evidence.alerts = await _alerts(client, window_start, end)
            evidence.ranks = await _placements(client, window_start, end)
        except (PrometheusAPIError, ConfigError) as exc:
            evidence.prometheus_error = str(exc)
    if responder_url is None:
        evidence.responder_error = "no responder URL"
    else:
        try:
            responder = ResponderClient(
                responder_url,
                token_file=responder_token_file,
                timeout=SERVICE_TIMEOUT_SECONDS,
                session=session,
            )
            evidence.incidents = await responder.incidents()
            evidence.notifications = await responder.notifications()
        except (ResponderClientError, ConfigError) as exc:
            evidence.responder_error = str(exc)
    evidence.alerts = align_with_incidents(evidence.alerts, evidence.incidents)
    return evidence


def align_with_incidents(
    alerts: list[AlertEvidence], incidents: list[IncidentRecord]
) -> list[AlertEvidence]:
    """Take each alert's firing and resolve times from the responder's record of the same
    alert (an incident member with the same labels: ``startsAt``/``endsAt`` as Prometheus
    sent them), where there is one.

    The ``ALERTS`` series only says when a rule evaluation first saw the alert firing, at
    the query's step; the responder has Prometheus's own timestamps. Using them here keeps
    the experiment's post-mortem and the responder's incident post-mortem in agreement.
    """

    def key(alertname: str, labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({**labels, "alertname": alertname}.items()))

    members = {key(m.alertname, m.labels): m for incident in incidents for m in incident.members}
    aligned = []
    for alert in alerts:
        member = members.get(key(alert.alertname, alert.labels))
        if member is None:
            aligned.append(alert)
            continue
        resolved = member.ends_at if member.ends_at is not None else alert.resolved_at
        update = {"firing_at": member.starts_at, "resolved_at": resolved, "source": "alertmanager"}
        aligned.append(alert.model_copy(update=update))
    return sorted(aligned, key=lambda a: a.firing_at)


async def _alerts(client: AsyncPrometheusClient, start: float, end: float) -> list[AlertEvidence]:
    found: list[AlertEvidence] = []
    series = await client.query_range(
        'ALERTS{alertstate="firing"}', start=start, end=end, step=ALERT_STEP_SECONDS
    )
    for s in series:
        labels = {k: v for k, v in s.labels.items() if k not in ("__name__", "alertstate")}
        if not s.points:
            continue
        first, last = s.points[0][0], s.points[-1][0]
        # Prometheus keeps answering a series for 5 m of staleness lookback only when
        # samples exist; a series whose last point is older than two steps has ended.
        ended = last < end - 2 * ALERT_STEP_SECONDS
        found.append(
            AlertEvidence(
                alertname=labels.get("alertname", "?"),
                labels=labels,
                firing_at=first,
                resolved_at=last + ALERT_STEP_SECONDS if ended else None,
            )
        )
    seen = {tuple(sorted(a.labels.items())) for a in found}
    for alert in await client.alerts():
        labels = {k: v for k, v in alert.labels.items() if k != "alertstate"}
        if alert.state != "firing" or alert.active_at is None or alert.active_at < start:
            continue
        if tuple(sorted(labels.items())) not in seen:
            found.append(
                AlertEvidence(
                    alertname=alert.name,
                    labels=labels,
                    firing_at=alert.active_at,
                    source="alerts_api",
                )
            )
    return sorted(found, key=lambda a: a.firing_at)


async def _placements(
    client: AsyncPrometheusClient, start: float, end: float
) -> list[RankPlacement]:
    """Every (job, rank, node) of :data:`PLACEMENT_QUERY` over the window."""
    found: set[RankPlacement] = set()
    series = await client.query_range(
        PLACEMENT_QUERY, start=start, end=end, step=PLACEMENT_STEP_SECONDS
    )
    for s in series:
        job, rank, node = (s.labels.get(k) for k in ("training_job", "rank", "node"))
        if job and node and rank is not None and rank.isdigit() and s.points:
            found.add(RankPlacement(training_job=job, rank=int(rank), node=node))
    return sorted(found, key=lambda p: (p.training_job, p.rank, p.node))


async def wait_for_evidence(
    collect: Callable[[], Awaitable[Evidence]],
    *,
    until: Callable[[Evidence], bool],
    timeout: float,
    poll: float = 2.0,
    on_poll: Callable[[Evidence, float], None] | None = None,
) -> Evidence:
    """Collect repeatedly until ``until(evidence)`` or ``timeout`` seconds; returns the last."""
    start = time.monotonic()
    while True:
        evidence = await collect()
        elapsed = time.monotonic() - start
        if until(evidence) or elapsed + poll > timeout:
            return evidence
        if on_poll is not None:
            on_poll(evidence, elapsed)
        await asyncio.sleep(poll)


def save_evidence(evidence: Evidence, path: Path) -> None:
    """Write ``evidence`` as JSON."""
    path.write_text(evidence.model_dump_json(indent=2), encoding="utf-8")


def load_evidence(path: Path) -> Evidence:
    """Read evidence saved by :func:`save_evidence`.

    Raises:
        ChaosError: the file is missing or not evidence.
    """
    try:
        return Evidence.model_validate_json(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ChaosError(f"{path}: cannot read the post-mortem evidence: {exc}") from exc


__all__ = [
    "AlertEvidence",
    "Evidence",
    "RankPlacement",
    "align_with_incidents",
    "collect_evidence",
    "load_evidence",
    "save_evidence",
    "wait_for_evidence",
]
