"""The agent's own settings: one frozen, validated model.

Precedence (applied by the CLI): defaults here < ``STORMWATCH_AGENT_*``
environment variables < command-line flags. Construct with
:meth:`AgentConfig.build` to get :class:`~stormwatch.agent.errors.AgentConfigError`
(naming the field and the fix) instead of a raw pydantic error.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from stormwatch.agent.errors import AgentConfigError
from stormwatch.urls import is_http_url

log = logging.getLogger(__name__)

#: Every collector the agent has; each can be switched off with ``--disable-collector``.
COLLECTOR_NAMES: tuple[str, ...] = (
    "gpu",  # DCGM-compatible device metrics + stormwatch_gpu_up
    "nvlink",  # per-link NVLink state and throughput
    "xid",  # XID events as counters
    "gpu_processes",  # GPU memory per rank, with FC-06 sanity checks
    "host",  # CPU and memory of the node
    "network",  # the node's kernel network counters (node_exporter's netstat, netdev names)
    "qdisc",  # the node's root queueing disciplines (node_exporter's qdisc names)
    "ranks",  # rank watcher: up, exits, progress; hangs, collective lag, stragglers
    "trainer",  # the trainer's multiprocess files, merged
    "faults",  # fault ledger counts
    "rendezvous",  # whether the node reaches each local job's rendezvous store (probes)
)

GpuBackendName = Literal["auto", "nvml", "sim"]

_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

#: Fields that ``stormwatch agent run`` sets from an option not named ``--<field-name>``.
OPTION_OF_FIELD = {
    "listen_host": "--listen",
    "listen_port": "--listen",
    "fault_listen_host": "--fault-api-listen",
    "fault_listen_port": "--fault-api-listen",
    "disabled_collectors": "--disable-collector",
}
#: Fields with no command-line option (the Python API's and the tests').
FIELDS_WITHOUT_OPTION = frozenset(
    {
        "rank_scan_interval",
        "rank_retention_seconds",
        "xid_window_seconds",
        "clock_events_window_seconds",
        "max_request_bytes",
    }
)


def option_of(field: str) -> str | None:
    """The ``stormwatch agent run`` option that sets ``field`` (None: no option does)."""
    if field in FIELDS_WITHOUT_OPTION or field not in AgentConfig.model_fields:
        return None
    return OPTION_OF_FIELD.get(field, "--" + field.replace("_", "-"))


def default_state_dir(node: str) -> Path:
    """``$XDG_STATE_HOME/stormwatch/agent/<node>`` (``~/.local/state`` when unset).

    Per node because several agents (one per lab namespace) share one filesystem.
    """
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "stormwatch" / "agent" / node


def parse_listen(value: str, *, field: str = "listen") -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:9400`` for IPv6) into host and port.

    Raises:
        AgentConfigError: malformed address or port outside 0..65535 (0 = any free port).
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise AgentConfigError(f"{field}: expected HOST:PORT such as 0.0.0.0:9400 (got {value!r})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    number = int(port)
    if number > 65535:
        raise AgentConfigError(f"{field}: port must be 0..65535 (got {number})")
    return host, number


class AgentConfig(BaseModel):
    """Settings of one ``stormwatch agent run``.

    Attributes:
        listen_host, listen_port: HTTP bind address; port 0 picks a free port.
        node: node name, exported as the ``Hostname`` label (dcgm-exporter's
            convention) and in ``stormwatch_agent_info``. Default: the host name.
        metrics_dir: the trainer's multiprocess directory (``STORMWATCH_METRICS_DIR``
            of the ranks); also where ``rank<R>.done`` markers appear. Created if missing.
        gpu_backend: ``nvml`` (real driver, required), ``sim`` (simulated GPUs),
            ``auto`` (NVML when a driver answers, otherwise no GPU: a warning and
            ``stormwatch_agent_info{gpu_backend="none"}``, never simulated GPUs).
        sim_gpus: number of simulated GPUs (``sim``).
        token_file: file holding the Bearer token of the fault API (required
            with ``fault_listen_host``). It must hold an ASCII token.
        fault_listen_host, fault_listen_port: the fault API's own listener
            (``POST/GET/DELETE /v1/faults``); None (the default): no fault API at
            all, nothing listens. Must differ from the metrics listener.
        web_config_file: Prometheus exporter-toolkit web-config file (TLS and
            basic auth, :mod:`stormwatch.agent.webconfig`); its TLS settings apply
            to both listeners, its basic auth users to the read-only one (the fault
            API takes the Bearer token). None: plain HTTP, no basic auth.
        state_dir: where the fault ledger lives; default :func:`default_state_dir`.
        sample_interval: seconds between NVML samples (1 s: dcgm-exporter's
            default collection interval is 30 s, but chaos experiments want
            second-level resolution and NVML reads take microseconds).
        rank_scan_interval: seconds between rank-watcher scans and rank-health
            evaluations (1 s). A tracked rank's exit starts a scan at once when the proc
            connector reports it; without the connector a SIGKILL plus a torchrun restart
            within the interval is still an exit (the rank's pid changed). Each scan reads
            every process's ``/proc/<pid>/stat``: 0.5 s cost an idle agent 2 % of a core.
        rank_retention_seconds: how long a rank that died (without its done
            marker) keeps its ``stormwatch_rank_up 0`` and last-progress series (1 h:
            long enough for staleness alerts and a post-mortem, short enough that
            finished jobs do not pile up); a cleanly finished rank is dropped at once.
        xid_window_seconds: how long ``DCGM_FI_DEV_XID_ERRORS`` keeps showing the
            last XID before returning to 0 (300 s, like dcgm-exporter's
            ``DCGM_EXP_XID_ERRORS_COUNT`` window); the counter never resets.
        clock_events_window_seconds: window of ``DCGM_EXP_CLOCK_EVENTS_COUNT``
            (300 s, dcgm-exporter's ``--clock-events-count-window-size`` default).
        rendezvous_probe_interval: seconds between probes of each local job's rendezvous
            store (1 s; each is one TCP connection to the store's host:
            :mod:`stormwatch.agent.collectors.rendezvous`).
        disabled_collectors: names from :data:`COLLECTOR_NAMES` to switch off.
        max_request_bytes: largest accepted request body (64 KiB; fault
            requests are a few hundred bytes).
        otlp_endpoint: OTLP/HTTP collector URL for the agent's spans (needs the
            ``opentelemetry-exporter-otlp-proto-http`` package); None: JSON lines
            to ``trace_file``.
        trace_file: JSON-lines span file; default ``<state_dir>/traces.jsonl``.
        trace_flush_timeout: seconds a span export or the final flush may take
            (3 s; bounds the agent's exit when the collector hangs, FC-08).
        claim_unlabelled_ranks: treat a rank that names no metrics folder (no
            ``STORMWATCH_METRICS_DIR``, no ``--metrics-dir`` after ``train``) as
            this node's (True: on a real node one agent owns every rank of the
            host). False where several agents share one PID namespace (the lab):
            then only ranks naming this agent's ``metrics_dir`` are claimed.
        hang_floor_seconds, hang_factor: a running rank is hung when its last
            heartbeat is older than ``max(hang_floor_seconds, hang_factor x the job's
            recent median step time)`` (5 s, 3; :mod:`stormwatch.agent.watch.detectors`).
        hang_warmup_steps, hang_warmup_seconds: until its process has completed
            ``hang_warmup_steps`` steps, a rank's threshold is at least
            ``hang_warmup_seconds`` (3, 60 s); also the threshold of a job without step
            marks (no step time to scale by).
        straggler_factor, straggler_samples: a rank is a compute straggler after
            ``straggler_samples`` consecutive steps with compute >= ``straggler_factor``
            x its peers' median while they wait longer in collectives (1.2, 3).
        pod_resources_socket: the kubelet's pod-resources socket; set on Kubernetes
            so that DCGM series carry ``namespace``/``pod``/``container`` (None: off).
    """

    # allow_inf_nan=False: NaN and infinities are refused as such ("a finite number"),
    # not by whichever bound they happen to fail.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    listen_host: str = "0.0.0.0"
    listen_port: int = Field(default=9400, ge=0, le=65535)
    node: str = Field(default_factory=socket.gethostname)
    metrics_dir: Path
    gpu_backend: GpuBackendName = "auto"
    sim_gpus: int = Field(default=2, ge=0, le=64)
    token_file: Path | None = None
    fault_listen_host: str | None = None
    fault_listen_port: int = Field(default=9401, ge=0, le=65535)
    web_config_file: Path | None = None
    state_dir: Path | None = None
    sample_interval: float = Field(default=1.0, gt=0, le=3600)
    rank_scan_interval: float = Field(default=1.0, gt=0, le=60)
    rank_retention_seconds: float = Field(default=3600.0, gt=0)
    xid_window_seconds: float = Field(default=300.0, gt=0)
    clock_events_window_seconds: float = Field(default=300.0, gt=0)
    rendezvous_probe_interval: float = Field(default=1.0, gt=0, le=3600)
    disabled_collectors: frozenset[str] = frozenset()
    max_request_bytes: int = Field(default=64 * 1024, ge=1024)
    otlp_endpoint: str | None = None
    trace_file: Path | None = None
    trace_flush_timeout: float = Field(default=3.0, gt=0, le=60)
    claim_unlabelled_ranks: bool = True
    hang_floor_seconds: float = Field(default=5.0, gt=0)
    hang_factor: float = Field(default=3.0, gt=0)
    hang_warmup_steps: int = Field(default=3, ge=1)
    hang_warmup_seconds: float = Field(default=60.0, gt=0)
    straggler_factor: float = Field(default=1.2, gt=1.0)
    straggler_samples: int = Field(default=3, ge=1)
    pod_resources_socket: str | None = None

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_url(cls, value: str | None) -> str | None:
        if value is not None and (not is_http_url(value) or re.search(r"\s", value)):
            raise ValueError("expected http(s)://HOST:PORT[/v1/traces] (OTLP over HTTP)")
        return value

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not value:
            raise ValueError(
                "must not be empty: give the node's name, or leave it out for the host name"
            )
        if not _NODE_RE.match(value):
            raise ValueError("use letters, digits, '.', '_' or '-' (at most 63 characters)")
        return value

    @field_validator("disabled_collectors")
    @classmethod
    def _known_collectors(cls, value: frozenset[str]) -> frozenset[str]:
        unknown = sorted(value - set(COLLECTOR_NAMES))
        if unknown:
            raise ValueError(f"unknown collector(s) {unknown}; valid: {', '.join(COLLECTOR_NAMES)}")
        return value

    @model_validator(mode="after")
    def _fault_listener(self) -> AgentConfig:
        if self.fault_listen_host is None:
            return self
        if self.token_file is None:
            raise ValueError(
                "fault_listen (--fault-api-listen) needs token_file (--token-file): "
                "the fault API only answers requests carrying its Bearer token"
            )
        if (self.fault_listen_host, self.fault_listen_port) == (
            self.listen_host,
            self.listen_port,
        ) and self.listen_port != 0:
            raise ValueError(
                "fault_listen (--fault-api-listen) must differ from listen (--listen): "
                "the fault API has its own listener"
            )
        return self

    @property
    def fault_api_enabled(self) -> bool:
        """Whether the fault API listens (``--fault-api-listen`` given)."""
        return self.fault_listen_host is not None

    @classmethod
    def build(cls, **values: Any) -> AgentConfig:
        """Validate ``values``; raise :class:`AgentConfigError` naming each field, its
        command-line option (``sample_interval (--sample-interval)``) and the value given."""
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = "; ".join(_problem(err) for err in exc.errors())
            raise AgentConfigError(f"agent config: {problems}") from exc

    @property
    def resolved_state_dir(self) -> Path:
        """``state_dir``, or the per-node default."""
        return self.state_dir if self.state_dir is not None else default_state_dir(self.node)

    @property
    def events_file(self) -> Path:
        """``<state dir>/events.jsonl``: the rank event log."""
        return self.resolved_state_dir / "events.jsonl"

    @property
    def diagnostics_dir(self) -> Path:
        """``<state dir>/diagnostics``: hang diagnostics, one folder per job and hang."""
        return self.resolved_state_dir / "diagnostics"

    @property
    def resolved_trace_file(self) -> Path:
        """``trace_file``, or ``<state dir>/traces.jsonl``."""
        if self.trace_file is not None:
            return self.trace_file
        return self.resolved_state_dir / "traces.jsonl"

    def enabled(self, collector: str) -> bool:
        """Whether ``collector`` (a name from :data:`COLLECTOR_NAMES`) runs."""
        if collector not in COLLECTOR_NAMES:  # a typo must not silently disable anything
            raise KeyError(collector)
        return collector not in self.disabled_collectors

    def read_token(self) -> str | None:
        """The fault-API token from ``token_file`` (stripped), or None without one.

        Raises:
            AgentConfigError: the file is missing, unreadable, not ASCII or empty.
        """
        if self.token_file is None:
            return None
        try:
            token = self.token_file.read_bytes().decode("ascii").strip()
        except OSError as exc:
            raise AgentConfigError(
                f"token_file: cannot read {self.token_file}: {exc.strerror}"
            ) from exc
        except UnicodeDecodeError as exc:
            raise AgentConfigError(
                f"token_file: {self.token_file} must hold an ASCII token"
            ) from exc
        if not token:
            raise AgentConfigError(f"token_file: {self.token_file} is empty; write a token into it")
        return token


def _problem(err: ErrorDetails) -> str:
    """One validation error as ``field (--option): message (got value)``, the style of the
    agent's other errors (``metrics_dir (--metrics-dir): ...``)."""
    message = err["msg"].removeprefix("Value error, ")
    if not err["loc"]:  # a rule across fields: its message names them
        return message
    field = ".".join(str(p) for p in err["loc"])
    option = option_of(str(err["loc"][0]))
    label = field if option is None else f"{field} ({option})"
    return f"{label}: {message} (got {err['input']!r})"


def ensure_metrics_dir(path: Path) -> None:
    """Check the metrics dir can hold the agent's and the ranks' files; create the folder
    itself when missing (logged), never its parents (a typo must not silently build a
    tree, e.g. at the filesystem root).

    Raises:
        AgentConfigError: the parent is missing, the folder cannot be created, or no file
            can be created in it (read-only, or a virtual filesystem such as /proc or /sys).
    """
    if not path.is_dir():
        if path.exists():
            raise AgentConfigError(
                f"metrics_dir (--metrics-dir): {path} is not a folder; give a folder"
            )
        if not path.parent.is_dir():
            raise AgentConfigError(
                f"metrics_dir (--metrics-dir): parent folder {path.parent} of {path} does not "
                "exist; create it or fix --metrics-dir"
            )
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            raise AgentConfigError(
                f"metrics_dir (--metrics-dir): cannot create {path}: {exc.strerror}; "
                "give a writable folder"
            ) from exc
        log.warning("metrics_dir (--metrics-dir): created %s (it did not exist)", path)
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".stormwatch-probe-")
    except OSError as exc:
        raise AgentConfigError(
            f"metrics_dir (--metrics-dir): cannot create files in {path}: {exc.strerror}; "
            "the agent and the ranks write there: give a writable folder on a regular "
            "filesystem (not /proc or /sys)"
        ) from exc
    os.close(fd)
    os.unlink(probe)


__all__ = [
    "COLLECTOR_NAMES",
    "FIELDS_WITHOUT_OPTION",
    "OPTION_OF_FIELD",
    "AgentConfig",
    "GpuBackendName",
    "default_state_dir",
    "ensure_metrics_dir",
    "option_of",
    "parse_listen",
]
