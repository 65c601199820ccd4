"""How the responder runs: :class:`ResponderSettings` (``stormwatch alerts serve`` options),
validated on construction, and the platform backend they select."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.alerts.actions.confirm_restart import ConfirmRestartSettings
from stormwatch.alerts.incident_report import PostMortemFiles, write_incident_postmortem
from stormwatch.alerts.policy import Policy, default_policy
from stormwatch.clients import AsyncPrometheusClient
from stormwatch.clients.http import HttpOptions
from stormwatch.errors import ConfigError
from stormwatch.platforms import (
    InvalidTargetFile,
    LabBackend,
    LabSlurmBackend,
    PlatformBackend,
    PlatformSettings,
    make_backend,
)
from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands

#: Seconds per Prometheus query (a local Prometheus answers ``confirm_restart``'s small
#: queries in milliseconds; 5 s keeps a hung one from stalling the action's polls).
PROMETHEUS_TIMEOUT_S = 5.0
#: Default request body limit: 1 MiB. Alertmanager's payload is ~1 KiB per alert,
#: so this allows groups of several hundred alerts.
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Default and largest ``limit`` of the list endpoints.
DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 100_000


@dataclass(frozen=True, kw_only=True)
class ResponderSettings:
    """How the responder runs.

    Attributes:
        db_path: SQLite database (created if missing; its folder must exist).
        token_file: file holding the Bearer token clients must send.
        host: listen address (default loopback).
        port: listen port; 0 picks a free one (see :attr:`Responder.url`).
            Default 19095, the lab's port (docs/ARCHITECTURE.md).
        prometheus_url: Prometheus base URL for read-only checks such as
            ``confirm_restart``; None skips them.
        prometheus_http: how to reach it (TLS, basic auth, Bearer token: a target file's
            ``prometheus.http``); None: plain HTTP.
        max_body_bytes: largest accepted request body (default 1 MiB).
        confirm: timing of ``confirm_restart``.
        policy: alert -> actions and the guards (default :func:`default_policy`:
            ``StormwatchRankStalled`` -> ``confirm_restart`` only).
        audit_jsonl: JSONL mirror of the audit log (default ``<db>.audit.jsonl``).
        lab_run_dir: the lab's run directory; enables the lab backend for
            remedial actions (node map from the target file ``lab up`` wrote in it,
            :meth:`LabBackend.for_lab`; diagnostics in
            ``<run-dir>/responder/diagnostics``). None: no backend. Post-mortems
            read the job's rank logs, dumps, spans, agent events and chaos
            journals from it.
        platform: which backend remedial actions use: ``lab`` (needs
            :attr:`lab_run_dir`), ``kubernetes`` or ``slurm`` (stormwatch/platforms/;
            with :attr:`lab_run_dir`, the Slurm lab's, see :meth:`backend`).
        platform_settings: the ``kubernetes``/``slurm`` settings (``--platform-config``);
            their diagnostics go to ``<db folder>/diagnostics``.
        postmortem_dir: where a post-mortem is written when an incident closes
            (``incident-<id>/``; default ``<db folder>/postmortems``).
        postmortems: False writes none (``--no-postmortems``).
    """

    db_path: Path
    token_file: Path
    host: str = "127.0.0.1"
    port: int = 19095
    prometheus_url: str | None = None
    prometheus_http: HttpOptions | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    confirm: ConfirmRestartSettings = field(default_factory=ConfirmRestartSettings)
    policy: Policy = field(default_factory=default_policy)
    audit_jsonl: Path | None = None
    lab_run_dir: Path | None = None
    platform: str = "lab"
    platform_settings: PlatformSettings = field(default_factory=PlatformSettings)
    postmortem_dir: Path | None = None
    postmortems: bool = True

    def prometheus_client(self) -> AsyncPrometheusClient:
        """The read-only actions' client of :attr:`prometheus_url`, reaching it with
        :attr:`prometheus_http` (timeout :data:`PROMETHEUS_TIMEOUT_S`).

        Raises:
            ConfigError: no :attr:`prometheus_url`, or it is not an http(s) URL.
        """
        if not self.prometheus_url:
            raise ConfigError("prometheus_url: not set; the read-only actions are skipped")
        return AsyncPrometheusClient(
            self.prometheus_url, timeout=PROMETHEUS_TIMEOUT_S, options=self.prometheus_http
        )

    @property
    def postmortem_path(self) -> Path:
        """Where post-mortems go (:attr:`postmortem_dir` or ``<db folder>/postmortems``)."""
        return self.postmortem_dir or Path(self.db_path).parent / "postmortems"

    def write_postmortem(self, incident_id: int) -> PostMortemFiles:
        """Write the post-mortem of ``incident_id`` from this responder's sources (blocking).

        Raises:
            UnknownIncident: no such incident.
            StoreError: the database cannot be read.
        """
        return write_incident_postmortem(
            db_path=self.db_path,
            incident_id=incident_id,
            postmortem_dir=self.postmortem_path,
            lab_run_dir=self.lab_run_dir,
            prometheus_url=self.prometheus_url,
            prometheus_http=self.prometheus_http,
            slurm=self.slurm_commands(),
        )

    def slurm_commands(self) -> SlurmCommands | None:
        """The Slurm command client of the ``slurm`` platform (its ``conf`` setting), for
        post-mortems to read the scheduler's record; None on other platforms."""
        if self.platform != "slurm":
            return None
        return SlurmCommands(conf=self.platform_settings.slurm.conf)

    @property
    def audit_path(self) -> Path:
        """Where the audit JSONL goes (:attr:`audit_jsonl` or ``<db>.audit.jsonl``)."""
        db = Path(self.db_path)
        return self.audit_jsonl or db.with_name(db.name + ".audit.jsonl")

    def lab_backend(self) -> LabBackend | None:
        """The lab backend for :attr:`lab_run_dir` (None without one).

        Raises:
            ConfigError: the lab's target file (``<run-dir>/target.yaml``) exists but is
                not readable or not a valid target file.
        """
        if self.lab_run_dir is None:
            return None
        run_dir = Path(self.lab_run_dir)
        try:
            return LabBackend.for_lab(
                run_dir, diagnostics_dir=run_dir / "responder" / "diagnostics"
            )
        except InvalidTargetFile as exc:
            raise ConfigError(f"lab_run_dir: {exc}") from exc

    def backend(self) -> PlatformBackend | None:
        """The backend :attr:`platform` names (lab: :meth:`lab_backend`, None without a run
        dir); ``slurm`` with :attr:`lab_run_dir` (the Slurm lab, whose target file
        ``alerts serve --target`` read) is :class:`LabSlurmBackend`: Slurm for Slurm jobs,
        the lab's processes for the jobs the lab launched directly (elastic ones).

        Raises:
            ConfigError: unknown platform, or an unreadable lab target file.
            BackendError: the Kubernetes client finds no cluster configuration.
        """
        if self.platform == "lab":
            return self.lab_backend()
        backend = make_backend(
            self.platform,
            self.platform_settings,
            diagnostics_dir=Path(self.db_path).parent / "diagnostics",
        )
        lab = self.lab_backend() if self.platform == "slurm" else None
        if isinstance(backend, SlurmBackend) and lab is not None:
            return LabSlurmBackend(slurm=backend, lab=lab)
        return backend

    def __post_init__(self) -> None:
        if self.platform not in ("lab", "kubernetes", "slurm"):
            raise ConfigError(f"platform: must be lab, kubernetes or slurm (got {self.platform!r})")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port: must be 0..65535 (got {self.port})")
        if not self.host:
            raise ConfigError("host: must not be empty (use 127.0.0.1)")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes: must be >= 1024 (got {self.max_body_bytes})")
        if not Path(self.db_path).parent.is_dir():
            raise ConfigError(
                f"db_path: folder {Path(self.db_path).parent} does not exist; create it first"
            )


__all__ = [
    "DEFAULT_LIST_LIMIT",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_LIST_LIMIT",
    "PROMETHEUS_TIMEOUT_S",
    "ResponderSettings",
]
