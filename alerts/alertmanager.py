"""Alertmanager configuration for the responder, generated from typed models.

:class:`AlertmanagerSettings` holds what the caller chooses (responder URL,
token file, timing); :func:`build_alertmanager_config` turns it into the typed
:class:`AlertmanagerConfig` (the subset of Alertmanager's schema we use), and
:func:`render_alertmanager_config` dumps that with PyYAML. No string templates.

The lab calls::

    write_alertmanager_config(
        AlertmanagerSettings(responder_url=state.responder_url, token_file=token), path
    )
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field

from stormwatch.contracts.labels import TRAINING_JOB_LABEL
from stormwatch.durations import format_duration
from stormwatch.errors import ConfigError
from stormwatch.urls import is_http_url

#: Path of the responder's webhook endpoint, appended to the responder's base URL.
WEBHOOK_PATH = "/v1/alertmanager"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Authorization(_Model):
    """``http_config.authorization``: the Bearer token is read from a file by Alertmanager."""

    type: Literal["Bearer"] = "Bearer"
    credentials_file: str


class HTTPConfig(_Model):
    """``webhook_configs[].http_config`` (only what we use)."""

    authorization: Authorization


class WebhookConfig(_Model):
    """One ``webhook_configs`` entry."""

    url: str
    send_resolved: bool = True
    #: Alertmanager truncates a notification to this many alerts (the payload's
    #: ``truncatedAlerts`` counts the rest). 1,000 alerts of a few hundred bytes stay well
    #: under the responder's 1 MiB body limit; 0 (unlimited) would let a huge group be
    #: refused with 413 and retried forever.
    max_alerts: int = 1000
    http_config: HTTPConfig


class Receiver(_Model):
    """One ``receivers`` entry."""

    name: str
    webhook_configs: list[WebhookConfig]


class Route(_Model):
    """A ``route`` node; durations are Prometheus duration strings.

    The top-level route sets every field; child routes (``routes``) set
    ``matchers`` and what they change, and inherit the rest (``None`` = inherit,
    left out of the YAML).
    """

    receiver: str
    matchers: list[str] | None = None
    group_by: list[str] | None = None
    group_wait: str | None = None
    group_interval: str | None = None
    repeat_interval: str | None = None
    continue_: bool | None = Field(default=None, serialization_alias="continue")
    routes: list[Route] | None = None


class InhibitRule(_Model):
    """One ``inhibit_rules`` entry: while a ``source`` alert fires, matching
    ``target`` alerts with the same values of the ``equal`` labels are muted."""

    source_matchers: list[str]
    target_matchers: list[str]
    equal: list[str]


class GlobalConfig(_Model):
    """The ``global`` section."""

    resolve_timeout: str


class AlertmanagerConfig(_Model):
    """An ``alertmanager.yml`` document (the subset of the schema we generate)."""

    global_: GlobalConfig = Field(serialization_alias="global")
    route: Route
    receivers: list[Receiver]
    inhibit_rules: list[InhibitRule] = Field(default_factory=list)

    def to_yaml(self) -> str:
        """The document as YAML, keys in schema order (unset route fields left out)."""
        data = self.model_dump(by_alias=True, mode="json", exclude_none=True)
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


@dataclass(frozen=True, kw_only=True)
class AlertmanagerSettings:
    """What the caller chooses for the generated Alertmanager configuration.

    Attributes:
        responder_url: base URL of the responder, e.g. ``http://127.0.0.1:19095``
            (``LabState.responder_url``); :data:`WEBHOOK_PATH` is appended.
        token_file: file holding the responder's Bearer token; must exist. Written
            to the config as an absolute path (Alertmanager reads it itself).
        group_wait_s: seconds to wait before the first notification of a new group.
            Default 30 s, Alertmanager's own default (the lab overrides it with its
            ``alert_group_wait``, 1 s, so that experiments see notifications at once).
        group_interval_s: seconds between notifications about a changed group
            (this also delays "resolved"). Default 5 m, Alertmanager's own default (the lab:
            ``alert_group_interval``).
        repeat_interval_s: seconds before re-sending an unchanged firing group.
            Default 4 h (Alertmanager's default); the responder ignores repeats.
        resolve_timeout_s: ``global.resolve_timeout`` for alerts without ``endsAt``
            (Prometheus always sets it). Default 5 m (Alertmanager's default).
        group_by: labels that group alerts into one notification; default
            ``("alertname", "training_job")`` = one notification per alert per training
            job (``training_job``: :data:`~stormwatch.contracts.labels.TRAINING_JOB_LABEL`;
            ``job`` is Prometheus's scrape job, the same on every agent's alert).
            The responder's incidents follow these groups (docs/ARCHITECTURE.md).
        receiver: name of the receiver of the remediation route
            (``StormwatchRankStalled``) and of anything no other route matches; the
            severity receivers are named ``<receiver>-critical`` / ``<receiver>-warning``.
        node_group_by: grouping of node-scoped alerts (:data:`NODE_SCOPED_ALERTS`):
            one notification per alert per node.
    """

    responder_url: str
    token_file: Path
    group_wait_s: float = 30.0
    group_interval_s: float = 300.0
    repeat_interval_s: float = 4 * 3600.0
    resolve_timeout_s: float = 300.0
    group_by: tuple[str, ...] = ("alertname", TRAINING_JOB_LABEL)
    receiver: str = "stormwatch-responder"
    node_group_by: tuple[str, ...] = ("alertname", "node")

    def __post_init__(self) -> None:
        if not is_http_url(self.responder_url):
            raise ConfigError(
                f"responder_url: {self.responder_url!r} is not an http(s) URL; "
                "use the responder's base URL, e.g. http://127.0.0.1:19095"
            )
        if any(ch.isspace() or not ch.isprintable() for ch in self.responder_url):
            raise ConfigError(
                f"responder_url: {self.responder_url!r} contains whitespace or control "
                "characters; pass a plain URL such as http://127.0.0.1:19095"
            )
        parts = urlsplit(self.responder_url)  # parses: is_http_url checked it
        if parts.query or parts.fragment:
            raise ConfigError(
                f"responder_url: {self.responder_url!r} must not have a query or fragment"
            )
        if not Path(self.token_file).is_file():
            raise ConfigError(
                f"token_file: {self.token_file} does not exist; create the responder "
                "token first (the lab writes <run-dir>/secrets/responder.token)"
            )
        for name in ("group_wait_s", "group_interval_s", "repeat_interval_s", "resolve_timeout_s"):
            value = getattr(self, name)
            if not value >= 0.001:
                raise ConfigError(f"{name}: must be at least 0.001 s (got {value!r})")
        if not self.group_by or not all(self.group_by):
            raise ConfigError(f"group_by: must name at least one label (got {self.group_by!r})")
        if not self.receiver:
            raise ConfigError("receiver: must not be empty")
        if not self.node_group_by or not all(self.node_group_by):
            raise ConfigError(
                f"node_group_by: must name at least one label (got {self.node_group_by!r})"
            )

    @property
    def webhook_url(self) -> str:
        """The responder's webhook URL (base URL + :data:`WEBHOOK_PATH`)."""
        base = self.responder_url.rstrip("/")
        return base if base.endswith(WEBHOOK_PATH) else base + WEBHOOK_PATH


#: Alerts about a node or its hardware rather than a training job (grouped by node).
NODE_SCOPED_ALERTS = (
    "StormwatchNodeDown|StormwatchAgentProcessDown|StormwatchAgentDown|StormwatchAgentFlapping"
    "|StormwatchScrapeSlow|StormwatchAgentRenderSlow|StormwatchAgentUnavailable"
    "|StormwatchGpu.*|StormwatchNvlink.*"
    "|StormwatchNodePacketLoss|StormwatchNodeBandwidthThrottled"
)
#: The alert whose incidents the responder remediates (``confirm_restart``).
REMEDIATION_ALERTS = ("StormwatchRankStalled",)


def build_routes(settings: AlertmanagerSettings) -> list[Route]:
    """The child routes, first match wins (no ``continue``).

    1. Remediation alerts (:data:`REMEDIATION_ALERTS`) -> ``settings.receiver``,
       grouped by ``settings.group_by`` (one incident per alert and job).
    2. Node-scoped alerts (:data:`NODE_SCOPED_ALERTS`) by severity ->
       ``<receiver>-critical`` / ``<receiver>-warning``, grouped by
       ``settings.node_group_by``.
    3. Everything else by severity -> the same two receivers, grouped by
       ``settings.group_by``. Unmatched (e.g. ``severity="info"``) stays on the root.
    """
    critical, warning = f"{settings.receiver}-critical", f"{settings.receiver}-warning"
    remediation = "|".join(REMEDIATION_ALERTS)
    node_by = list(settings.node_group_by)
    return [
        Route(receiver=settings.receiver, matchers=[f'alertname=~"{remediation}"']),
        Route(
            receiver=critical,
            matchers=[f'alertname=~"{NODE_SCOPED_ALERTS}"', 'severity="critical"'],
            group_by=node_by,
        ),
        Route(
            receiver=warning,
            matchers=[f'alertname=~"{NODE_SCOPED_ALERTS}"', 'severity="warning"'],
            group_by=node_by,
        ),
        Route(receiver=critical, matchers=['severity="critical"']),
        Route(receiver=warning, matchers=['severity="warning"']),
    ]


def build_inhibit_rules() -> list[InhibitRule]:
    """Inhibitions (Alertmanager mutes the target while the source fires).

    * ``StormwatchNodeDown`` mutes every other alert carrying the same ``node``
      (its GPUs, links, and rank alerts that carry ``node``).
    * ``StormwatchGpuLost`` mutes the other GPU and NVLink alerts of that GPU
      (same ``node`` and ``gpu``).
    * ``StormwatchTrainingHung`` mutes ``StormwatchThroughputDrop`` of the job;
      ``StormwatchLossNaN`` mutes ``StormwatchLossSpike`` of the job.
    * ``StormwatchAgentDown`` mutes ``StormwatchAgentUnavailable`` of the node (an agent
      gone from discovery is unavailable too; the first says more).
    """
    return [
        InhibitRule(
            source_matchers=['alertname="StormwatchNodeDown"'],
            target_matchers=['alertname!="StormwatchNodeDown"', 'node=~".+"'],
            equal=["node"],
        ),
        InhibitRule(
            source_matchers=['alertname="StormwatchGpuLost"'],
            target_matchers=[
                'alertname=~"StormwatchGpu.*|StormwatchNvlink.*"',
                'alertname!="StormwatchGpuLost"',
            ],
            equal=["node", "gpu"],
        ),
        InhibitRule(
            source_matchers=['alertname="StormwatchTrainingHung"'],
            target_matchers=['alertname="StormwatchThroughputDrop"'],
            equal=[TRAINING_JOB_LABEL],
        ),
        InhibitRule(
            source_matchers=['alertname="StormwatchLossNaN"'],
            target_matchers=['alertname="StormwatchLossSpike"'],
            equal=[TRAINING_JOB_LABEL],
        ),
        InhibitRule(
            source_matchers=['alertname="StormwatchAgentDown"'],
            target_matchers=['alertname="StormwatchAgentUnavailable"'],
            equal=["node"],
        ),
    ]


def build_alertmanager_config(settings: AlertmanagerSettings) -> AlertmanagerConfig:
    """The routing tree of :func:`build_routes` to three webhook receivers that
    all post to the responder, and the inhibitions of :func:`build_inhibit_rules`.

    Every receiver sends resolved notifications too (the responder closes
    incidents on them) and authenticates with the Bearer token in
    ``settings.token_file``. On a real cluster add a pager to
    ``<receiver>-critical`` and a ticket queue to ``<receiver>-warning``
    (docs/runbooks.md "Alertmanager on a real cluster").
    """
    webhook = WebhookConfig(
        url=settings.webhook_url,
        send_resolved=True,
        http_config=HTTPConfig(
            authorization=Authorization(credentials_file=str(Path(settings.token_file).resolve()))
        ),
    )
    names = (settings.receiver, f"{settings.receiver}-critical", f"{settings.receiver}-warning")
    return AlertmanagerConfig(
        global_=GlobalConfig(resolve_timeout=format_duration(settings.resolve_timeout_s)),
        route=Route(
            receiver=settings.receiver,
            group_by=list(settings.group_by),
            group_wait=format_duration(settings.group_wait_s),
            group_interval=format_duration(settings.group_interval_s),
            repeat_interval=format_duration(settings.repeat_interval_s),
            routes=build_routes(settings),
        ),
        receivers=[Receiver(name=name, webhook_configs=[webhook]) for name in names],
        inhibit_rules=build_inhibit_rules(),
    )


def render_alertmanager_config(settings: AlertmanagerSettings) -> str:
    """``alertmanager.yml`` text for ``settings`` (see :func:`build_alertmanager_config`)."""
    return build_alertmanager_config(settings).to_yaml()


def write_alertmanager_config(settings: AlertmanagerSettings, path: Path) -> Path:
    """Write ``alertmanager.yml`` for ``settings`` to ``path`` (atomically) and return it.

    Raises:
        ConfigError: ``path`` cannot be written (a folder, a missing or read-only parent);
            nothing is left behind, neither ``path`` nor the temporary file beside it.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(render_alertmanager_config(settings), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(
            f"--output: cannot write {path}: {exc.strerror or exc}; give a file path in a "
            "writable folder"
        ) from exc
    return path


__all__ = [
    "NODE_SCOPED_ALERTS",
    "REMEDIATION_ALERTS",
    "WEBHOOK_PATH",
    "AlertmanagerConfig",
    "AlertmanagerSettings",
    "Authorization",
    "GlobalConfig",
    "HTTPConfig",
    "InhibitRule",
    "Receiver",
    "Route",
    "WebhookConfig",
    "build_alertmanager_config",
    "build_inhibit_rules",
    "build_routes",
    "render_alertmanager_config",
    "write_alertmanager_config",
]
