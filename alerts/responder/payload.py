"""Alertmanager webhook payload, version 4, as pydantic models.

Field names follow Alertmanager's JSON (``groupKey``, ``startsAt``, ...) through
aliases, so validation errors name the field as the sender wrote it (e.g.
``alerts.0.fingerprint``). Unknown fields are ignored: Alertmanager may add
fields within version 4.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class WebhookAlert(_Model):
    """One alert in a notification.

    Attributes:
        status: ``firing`` or ``resolved``.
        labels: the alert's labels; always include ``alertname``.
        annotations: summary, description, runbook_url, ...
        starts_at: when the alert started firing (timezone-aware).
        ends_at: when it resolved, or ``None`` (Alertmanager sends year 1 while firing).
        generator_url: link to the expression in Prometheus.
        fingerprint: Alertmanager's hash of the label set (hex).
    """

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime = Field(alias="startsAt")
    ends_at: datetime | None = Field(default=None, alias="endsAt")
    generator_url: str = Field(default="", alias="generatorURL")
    fingerprint: str = Field(min_length=1, max_length=128, pattern=r"^[0-9A-Za-z]+$")

    @field_validator("labels")
    @classmethod
    def _has_alertname(cls, labels: dict[str, str]) -> dict[str, str]:
        if not labels.get("alertname"):
            raise ValueError("must contain a non-empty 'alertname' label")
        return labels

    @field_validator("starts_at", "ends_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must carry a timezone (RFC 3339, e.g. 2024-05-01T12:00:00Z)")
        return value

    @property
    def alertname(self) -> str:
        """The ``alertname`` label."""
        return self.labels["alertname"]

    @property
    def starts_at_unix(self) -> float:
        """``startsAt`` as Unix seconds (microsecond resolution)."""
        return self.starts_at.timestamp()

    @property
    def ends_at_unix(self) -> float | None:
        """``endsAt`` as Unix seconds, or ``None`` when unset (Alertmanager's year 1)."""
        if self.ends_at is None or self.ends_at <= _EPOCH:
            return None
        return self.ends_at.timestamp()

    @property
    def starts_at_key(self) -> str:
        """``startsAt`` normalised to UTC ISO 8601, for deduplication keys."""
        return self.starts_at.astimezone(UTC).isoformat()


class WebhookMessage(_Model):
    """One webhook notification (a group of alerts), payload version ``"4"``."""

    version: Literal["4"]
    group_key: str = Field(alias="groupKey", min_length=1)
    truncated_alerts: int = Field(default=0, alias="truncatedAlerts", ge=0)
    status: Literal["firing", "resolved"]
    receiver: str
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field(default="", alias="externalURL")
    alerts: list[WebhookAlert] = Field(min_length=1)


__all__ = ["WebhookAlert", "WebhookMessage"]
