"""What a run reports about itself: per-rank telemetry (:class:`TelemetryConfig`), spans
(:class:`TracingConfig`) and rank 0's progress lines (:class:`ProgressConfig`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from stormwatch.errors import ConfigError
from stormwatch.otel import OTLP_PACKAGE, otlp_available
from stormwatch.trainer.config.checks import check, check_folder
from stormwatch.trainer.config.options import option
from stormwatch.urls import is_http_url

#: Default of ``--log-every``: a line every 10 steps (and at the last step).
DEFAULT_LOG_EVERY = 10


@dataclass(frozen=True, kw_only=True)
class TelemetryConfig:
    """Per-rank telemetry outputs (see docs/ARCHITECTURE.md "Trainer -> agent telemetry").

    Attributes:
        job: value of the ``job`` label and of the log records.
        log_dir: folder for ``rank<R>.jsonl``; ``None`` disables the event log.
        metrics_dir: prometheus-client multiprocess folder; ``None`` disables metrics.
        peak_flops: peak FLOP/s of one device for MFU; ``None`` looks the device
            up with :func:`stormwatch.telemetry.peak_flops` (a table by device name; on
            CPU a nominal 1e11).
        count_collectives: count and time every collective (the
            :class:`~stormwatch.telemetry.CollectiveCounter`: collective
            metrics, the compute/wait split, the dump's recent collectives).
            ``False`` only for the "bare" trainer of ``benchmarks/trainer_bench.py``
            (the instrumentation-overhead baseline); no CLI option.
    """

    job: str = option(
        "--job", default="train", envvar="STORMWATCH_JOB", help="Job name (metric label)."
    )
    log_dir: Path | None = option(
        "--log-dir", default=None, help="Write per-rank JSON-lines events to <dir>/rank<R>.jsonl."
    )
    metrics_dir: Path | None = option(
        "--metrics-dir",
        default=None,
        envvar="STORMWATCH_METRICS_DIR",
        help="prometheus-client multiprocess folder.",
    )
    peak_flops: float | None = option(
        "--peak-flops",
        default=None,
        metavar="FLOPS",
        default_text="by GPU name; CPU: nominal 1e11",
        help="Peak FLOP/s of one device for MFU.",
    )
    count_collectives: bool = True

    def __post_init__(self) -> None:
        check(
            bool(self.job) and self.job.isprintable() and len(self.job) <= 128,
            "job",
            f"must be a non-empty printable string of at most 128 characters (got {self.job!r})",
        )
        if self.peak_flops is not None:
            check(
                isinstance(self.peak_flops, (int, float))
                and math.isfinite(self.peak_flops)
                and self.peak_flops > 0,
                "peak_flops",
                f"must be a finite number of FLOP/s > 0, e.g. 989e12 (got {self.peak_flops!r})",
            )
        check_folder(self.log_dir, "log_dir")
        check_folder(self.metrics_dir, "metrics_dir")


@dataclass(frozen=True, kw_only=True)
class TracingConfig:
    """Where OpenTelemetry spans go (:meth:`stormwatch.telemetry.Session.trace`).

    Attributes:
        otlp_endpoint: the collector's OTLP/HTTP base URL, meant as
            ``OTEL_EXPORTER_OTLP_ENDPOINT`` is (e.g. ``http://127.0.0.1:4318``; ``/v1/traces``
            is appended unless the URL ends with it); takes precedence over ``spans_dir``.
        spans_dir: folder for per-rank ``rank<R>.jsonl`` span files (the CLI
            defaults it to ``<log-dir>/spans``).
        flush_timeout: seconds the exit path waits for the export (default
            2 s: a few seconds at most added to an exit, FC-08).
    """

    otlp_endpoint: str | None = option(
        "--otlp-endpoint",
        default=None,
        envvar="STORMWATCH_OTLP_ENDPOINT",
        metavar="URL",
        help="Export spans over OTLP/HTTP to this collector base URL, as "
        "OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://127.0.0.1:4318).",
    )
    spans_dir: Path | None = option(
        "--spans-dir",
        default=None,
        default_under=("log_dir", "spans"),
        help="Write spans as JSON lines to <dir>/rank<R>.jsonl when no OTLP endpoint is set.",
    )
    flush_timeout: float = option(
        "--trace-flush-timeout",
        default=2.0,
        metavar="SECONDS",
        help="Longest wait for the span export at exit.",
    )

    def __post_init__(self) -> None:
        if self.otlp_endpoint is not None:
            check(
                is_http_url(self.otlp_endpoint),
                "otlp_endpoint",
                "must be an http(s) URL such as http://127.0.0.1:4318/v1/traces "
                f"(got {self.otlp_endpoint!r})",
            )
        check(
            isinstance(self.flush_timeout, (int, float)) and 0 < self.flush_timeout <= 60,
            "trace_flush_timeout",
            f"must be in (0, 60] seconds (got {self.flush_timeout!r})",
        )

    @property
    def enabled(self) -> bool:
        """True when spans are exported somewhere."""
        return self.otlp_endpoint is not None or self.spans_dir is not None


@dataclass(frozen=True, kw_only=True)
class ProgressConfig:
    """Rank 0's progress lines on stderr (:class:`~stormwatch.trainer.progress.ConsoleProgress`).

    Attributes:
        every: a step line every ``every`` steps, and at the last step.
        quiet: no progress lines (the warning that nothing was trained still shows).
    """

    every: int = option(
        "--log-every",
        default=DEFAULT_LOG_EVERY,
        metavar="N",
        help="Progress line on stderr (rank 0) every N steps and at the last step.",
    )
    quiet: bool = option(
        "--quiet",
        "-q",
        default=False,
        help="No progress lines on stderr (warnings still shown).",
    )

    def __post_init__(self) -> None:
        check(
            isinstance(self.every, int) and not isinstance(self.every, bool) and self.every >= 1,
            "log_every",
            f"must be an integer >= 1 (got {self.every!r})",
        )


def check_otlp_available() -> None:
    """Raise :class:`ConfigError` naming the pip package when the OTLP exporter is missing."""
    if not otlp_available():
        raise ConfigError(
            f"otlp_endpoint: exporting spans over OTLP needs the package {OTLP_PACKAGE} "
            f"(pip install {OTLP_PACKAGE}), or leave --otlp-endpoint unset to write JSON lines"
        )


__all__ = [
    "DEFAULT_LOG_EVERY",
    "ProgressConfig",
    "TelemetryConfig",
    "TracingConfig",
    "check_otlp_available",
]
