"""The soak (``make soak``, issue 18): a fault-free job on the lab for ``minutes`` minutes,
with checkpoints, evaluation-like pauses, a planned restart and an elastic resize, and a
count of every alert that fired meanwhile. The target is zero: anything that fires is a
false alarm, since no fault was injected.

The schedule (:meth:`SoakPlan.schedule`, fractions of the soak):

* from the start: an elastic job (``--nnodes 1:2``) checkpointing every
  ``checkpoint_every`` steps, pausing ``eval_seconds`` in the phase ``eval`` every
  ``eval_every`` steps (the trainer's ``--eval-every``);
* at ``restart_at``: a planned restart, the whole job stopped (SIGTERM, the lab's grace)
  and started again under the same name: it resumes from its last checkpoint;
* at ``resize_at``: an elastic resize, node 1's torchrun stopped (SIGTERM): the job
  shrinks to node 0 and resumes; ``rejoin_after_seconds`` later node 1 rejoins and the
  job grows back;
* at the end: the job is stopped, and every alert that fired from the job's start until
  ``settle_seconds`` after the end is counted (``ALERTS{alertstate="firing"}``, each
  firing episode of each label set once: :func:`fired_alerts`).

Written to ``<run-dir>/soaks/<id>/soak.json`` and ``soak.md`` (:class:`SoakReport`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from stormwatch.chaos.reports.evidence import AlertEvidence
from stormwatch.clients.prometheus import PrometheusAPI, Series
from stormwatch.errors import ConfigError

#: Query resolution of the alert count (s): the lab evaluates rules every second.
ALERT_STEP_SECONDS = 1.0


@dataclass(frozen=True, kw_only=True)
class SoakPlan:
    """What the soak does and when (see the module docstring).

    Attributes:
        minutes: length of the soak (30: issue 18's; ``SOAK_MINUTES`` in ``make soak``).
        job: the job's name on the lab.
        step_delay: seconds each step sleeps (0.3: the game day's jobs).
        checkpoint_every: steps between checkpoints (20: one every ~10 s on the lab).
        eval_every, eval_seconds: the evaluation-like pause (every 200 steps, 15 s: three
            times the 5 s stall floor, so a phase-blind rule would fire).
        restart_at, resize_at: fractions of the soak at which the planned restart and the
            elastic resize happen (``None``: skipped).
        rejoin_after_seconds: how long node 1 stays out of the job at the resize.
        settle_seconds: how long alerts are still counted after the job stopped.

    Raises:
        ConfigError: a value out of range (names the field).
    """

    minutes: float = 30.0
    job: str = "soak"
    step_delay: float = 0.3
    checkpoint_every: int = 20
    eval_every: int = 200
    eval_seconds: float = 15.0
    restart_at: float | None = 0.4
    resize_at: float | None = 0.7
    rejoin_after_seconds: float = 60.0
    settle_seconds: float = 15.0

    def __post_init__(self) -> None:
        if not self.minutes > 0:
            raise ConfigError(f"soak minutes: must be > 0 (got {self.minutes})")
        for name in ("restart_at", "resize_at"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value < 1.0:
                raise ConfigError(f"soak {name}: a fraction of the soak in (0, 1) (got {value})")
        if self.checkpoint_every < 1 or self.eval_every < 0:
            raise ConfigError("soak checkpoint_every >= 1 and eval_every >= 0 steps")

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    def schedule(self) -> list[tuple[float, str]]:
        """``(seconds after the start, action)`` in time order; actions: ``restart``,
        ``leave`` (node 1 leaves), ``rejoin``, ``stop``."""
        out = []
        if self.restart_at is not None:
            out.append((self.restart_at * self.seconds, "restart"))
        if self.resize_at is not None:
            leave = self.resize_at * self.seconds
            out.append((leave, "leave"))
            out.append((min(leave + self.rejoin_after_seconds, self.seconds), "rejoin"))
        out.append((self.seconds, "stop"))
        return sorted(out, key=lambda item: item[0])


class SoakEvent(BaseModel):
    """One thing the soak did (Unix time)."""

    model_config = ConfigDict(extra="forbid")

    at: float
    action: str
    detail: str = ""


class SoakReport(BaseModel):
    """A soak run (``soak.json``): what it did and every alert that fired."""

    model_config = ConfigDict(extra="forbid")

    job: str
    minutes: float
    started_at: float
    ended_at: float | None = None
    events: list[SoakEvent] = Field(default_factory=list)
    alerts: list[AlertEvidence] = Field(default_factory=list)
    error: str | None = None

    @property
    def false_alarms(self) -> int:
        """Alerts that fired: every one is a false alarm (no fault was injected)."""
        return len(self.alerts)

    @property
    def ok(self) -> bool:
        return self.error is None and self.false_alarms == 0


def fired_alerts(
    series: Sequence[Series], *, step: float = ALERT_STEP_SECONDS
) -> list[AlertEvidence]:
    """Every firing episode in ``ALERTS{alertstate="firing"}`` range results, in order.

    A label set counts once per episode: a gap of more than two ``step`` s between its
    firing points ends one (a flapping alert counts each time it fires again).
    """
    found: list[AlertEvidence] = []
    for s in series:
        labels = {k: v for k, v in s.labels.items() if k not in ("__name__", "alertstate")}
        start = previous = None
        for at, _ in s.points:
            if start is None:
                start = at
            elif previous is not None and at - previous > 2 * step:
                found.append(_episode(labels, start, previous + step))
                start = at
            previous = at
        if start is not None and previous is not None:
            found.append(_episode(labels, start, previous + step))
    return sorted(found, key=lambda a: (a.firing_at, a.alertname))


def _episode(labels: dict[str, str], start: float, end: float) -> AlertEvidence:
    return AlertEvidence(
        alertname=labels.get("alertname", "?"), labels=labels, firing_at=start, resolved_at=end
    )


def count_alerts(prometheus: PrometheusAPI, start: float, end: float) -> list[AlertEvidence]:
    """The alerts that fired between ``start`` and ``end`` (Unix s), per :func:`fired_alerts`."""
    series = prometheus.query_range(
        'ALERTS{alertstate="firing"}', start=start, end=end, step=ALERT_STEP_SECONDS
    )
    return fired_alerts(series)


def render_markdown(report: SoakReport) -> str:
    """The report as Markdown: the verdict, what the soak did, every alert that fired."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.started_at))
    verdict = "**pass**" if report.ok else "**fail**"
    lines = [
        f"# Soak: job `{report.job}`, {report.minutes:g} min from {when}",
        "",
        f"{verdict}: **{report.false_alarms} alert(s) fired** (target 0; no fault was injected)"
        + (f"; error: {report.error}" if report.error else "")
        + ".",
        "",
        "| t (s) | action | detail |",
        "|---:|---|---|",
    ]
    lines += [
        f"| {e.at - report.started_at:.0f} | {e.action} | {e.detail or '—'} |"
        for e in report.events
    ]
    if report.alerts:
        lines += ["", "| alert | labels | fired at t (s) | for (s) |", "|---|---|---:|---:|"]
        for a in report.alerts:
            shown = {k: v for k, v in a.labels.items() if k != "alertname"}
            lasted = "—" if a.resolved_at is None else f"{a.resolved_at - a.firing_at:.0f}"
            lines.append(
                f"| {a.alertname} | {shown} | {a.firing_at - report.started_at:.0f} | {lasted} |"
            )
    return "\n".join(lines) + "\n"


def write_report(report: SoakReport, folder: Path) -> tuple[Path, Path]:
    """Write ``soak.json`` and ``soak.md`` into ``folder``; returns (md, json)."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / "soak.json", folder / "soak.md"
    json_path.write_text(report.model_dump_json(indent=2), encoding="utf-8")
    md_path.write_text(render_markdown(report), encoding="utf-8")
    return md_path, json_path


class SoakActions:
    """What the soak asks of the lab (:class:`stormwatch.lab.Lab` through
    :func:`lab_actions`; a test may pass its own)."""

    def __init__(
        self,
        *,
        start: Callable[[], str],
        stop: Callable[[], str],
        leave: Callable[[], str],
        rejoin: Callable[[], str],
    ) -> None:
        self.start, self.stop, self.leave, self.rejoin = start, stop, leave, rejoin


def run_soak(
    plan: SoakPlan,
    actions: SoakActions,
    prometheus: PrometheusAPI,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    on_event: Callable[[SoakEvent], None] | None = None,
) -> SoakReport:
    """Run ``plan`` (module docstring); the job is stopped whatever happens."""
    report = SoakReport(job=plan.job, minutes=plan.minutes, started_at=clock())

    def note(action: str, detail: str) -> None:
        event = SoakEvent(at=clock(), action=action, detail=detail)
        report.events.append(event)
        if on_event is not None:
            on_event(event)

    stopped = False
    try:
        note("start", actions.start())
        for offset, action in plan.schedule():
            wait = report.started_at + offset - clock()
            if wait > 0:
                sleep(wait)
            if action == "restart":
                note("restart", actions.stop() + "; " + actions.start())
            elif action == "leave":
                note("leave", actions.leave())
            elif action == "rejoin":
                note("rejoin", actions.rejoin())
            else:
                note("stop", actions.stop())
                stopped = True
    except Exception as exc:  # the report says what failed; the job is stopped below
        report.error = f"{type(exc).__name__}: {exc}"
    finally:
        if not stopped:
            try:
                note("stop", actions.stop())
            except Exception as exc:
                report.error = report.error or f"stop failed: {exc}"
    sleep(plan.settle_seconds)
    report.ended_at = clock()
    report.alerts = count_alerts(prometheus, report.started_at, report.ended_at)
    return report


__all__ = [
    "ALERT_STEP_SECONDS",
    "SoakActions",
    "SoakEvent",
    "SoakPlan",
    "SoakReport",
    "count_alerts",
    "fired_alerts",
    "render_markdown",
    "run_soak",
    "write_report",
]
