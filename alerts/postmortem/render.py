"""Render an incident post-mortem: plots (PNG), ``postmortem.md`` and one self-contained HTML file.

The HTML page has no script and no external reference: its plots are inlined
as ``data:image/png;base64`` URIs and its style sheet is inline, so it opens
offline and can be attached to a ticket as one file.
"""

from __future__ import annotations

import html
from pathlib import Path

from stormwatch.alerts.postmortem.model import IncidentPostMortem, PlotRef
from stormwatch.alerts.postmortem.sources import Inputs
from stormwatch.chaos.reports.plots import Line, Marker, Panel, plot_time_series, png_data_uri
from stormwatch.chaos.reports.postmortem import format_clock
from stormwatch.trainer.telemetry.events import StartEvent, StepEvent

#: Window of the rank-log throughput (completed steps per second over the last N s).
RATE_WINDOW_S = 10.0


def _markers(pm: IncidentPostMortem) -> list[Marker]:
    moments = [
        (pm.onset_at, f"onset ({pm.onset_source})", "tab:red"),
        (pm.detected_at, "alert firing", "tab:orange"),
        (pm.restart_action_at, "responder restarted the workers", "tab:brown"),
        (pm.restarted_at, "first worker started again", "tab:purple"),
        (pm.recovered_at, "first step after resume", "tab:green"),
        (pm.resolved_at, "incident closed", "tab:gray"),
    ]
    return [Marker(at, label, color) for at, label, color in moments if at is not None]


def _rank_log_panels(inputs: Inputs, origin: float, markers: list[Marker]) -> list[Panel]:
    """Step time, throughput and heartbeats from the rank logs; a line breaks at each
    worker restart (NaN points), so an outage is never drawn as a slope."""
    start, end = inputs.window
    step_time, beats = [], []
    gap = float("nan")
    for rank, log in sorted(inputs.rank_logs.items()):
        points: list[tuple[float, float]] = []
        for event in log.events:
            if not start <= event.time <= end:
                continue
            if isinstance(event, StartEvent):
                points.append((event.time, gap))
            elif isinstance(event, StepEvent) and event.step_seconds:
                points.append((event.time, event.step_seconds))
        step_time.append(Line(f"rank {rank}", points))
        ticks = [(e.time, float(rank)) for e in log.steps if start <= e.time <= end]
        beats.append(Line(f"rank {rank}", ticks, marker_only=True))
    rate: list[tuple[float, float]] = []
    if inputs.rank_logs:
        rank0 = inputs.rank_logs[min(inputs.rank_logs)]
        times = sorted(e.time for e in rank0.steps if start <= e.time <= end)
        if times:
            grid = max(1.0, (end - start) / 400)
            t = times[0]
            while t <= min(end, times[-1] + RATE_WINDOW_S):
                done = sum(1 for u in times if t - RATE_WINDOW_S < u <= t)
                rate.append((t, done / RATE_WINDOW_S))
                t += grid
    return [
        Panel("Step time per rank", "step time (s, rank logs)", origin, step_time, markers),
        Panel(
            "Throughput",
            f"steps per second ({RATE_WINDOW_S:g} s window, rank logs)",
            origin,
            [Line("job", rate)],
            markers,
        ),
        Panel("Per-rank heartbeats (one tick per completed step)", "rank", origin, beats, markers),
    ]


def _prometheus_panels(inputs: Inputs, origin: float, markers: list[Marker]) -> list[Panel]:
    prom = inputs.prometheus

    def lines(name: str) -> list[Line]:
        return [Line(label, points) for label, points in sorted(prom.get(name, {}).items())]

    return [
        Panel(
            "Step time per rank",
            "mean step time (s, Prometheus)",
            origin,
            lines("step_seconds"),
            markers,
        ),
        Panel(
            "Throughput",
            "tokens per second (job, 10 s rate, Prometheus)",
            origin,
            lines("tokens_per_second"),
            markers,
        ),
        Panel(
            "Per-rank heartbeat age",
            "seconds since the last step (Prometheus)",
            origin,
            lines("heartbeat_age_seconds"),
            markers,
        ),
    ]


def write_plots(pm: IncidentPostMortem, inputs: Inputs, folder: Path) -> list[PlotRef]:
    """Draw step time, throughput and heartbeats around the incident into ``folder``.

    Prometheus range queries when they returned data, else the rank logs.
    """
    origin = pm.onset_at if pm.onset_at is not None else pm.detected_at
    markers = _markers(pm)
    use_prometheus = any(inputs.prometheus.get(name) for name in inputs.prometheus)
    source = "prometheus" if use_prometheus else "rank logs"
    panels = (_prometheus_panels if use_prometheus else _rank_log_panels)(inputs, origin, markers)
    refs = []
    for name, panel in zip(("step_time", "throughput", "heartbeats"), panels, strict=True):
        plot_time_series(panel, folder / f"{name}.png")
        refs.append(PlotRef(name=name, title=panel.title, file=f"{name}.png", source=source))
    return refs


# -- text ------------------------------------------------------------------------------------


def _secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def _opt(value: object) -> str:
    return "—" if value is None else str(value)


def summary_rows(pm: IncidentPostMortem) -> list[tuple[str, str]]:
    """(measure, value) rows shared by the Markdown and the HTML."""
    impact, culprit = pm.impact, pm.culprit
    who = " / ".join(
        x for x in (f"rank {culprit.rank}" if culprit.rank is not None else None, culprit.node) if x
    )
    return [
        ("incident", f"{pm.incident_id} ({pm.status}): {pm.alertname} on job {pm.job or '—'}"),
        (
            "likely culprit",
            f"{who or 'unknown'} — {culprit.method.replace('_', ' ')}"
            + ("" if culprit.certain else " (uncertain)"),
        ),
        ("onset", f"{format_clock(pm.onset_at)} ({pm.onset_source or '—'})"),
        ("time to detect (onset → alert firing)", _secs(pm.time_to_detect_seconds)),
        ("time to recover (onset → first step after resume)", _secs(pm.time_to_recover_seconds)),
        ("last step before the restart", _opt(impact.last_step_before)),
        ("resumed from step", _opt(impact.resumed_from_step)),
        ("steps lost", _opt(impact.steps_lost)),
        ("time lost", _secs(impact.time_lost_seconds)),
        (
            "GPU-hours lost (ranks x time lost)",
            "—"
            if impact.gpu_hours_lost is None
            else f"{impact.gpu_hours_lost:.4f} ({impact.world_size} ranks)",
        ),
        ("goodput during the incident", "—" if impact.goodput is None else f"{impact.goodput:.0%}"),
        ("actions", "; ".join(pm.actions) or "none"),
    ]


def _since(pm: IncidentPostMortem, at: float | None) -> str:
    if at is None or pm.onset_at is None:
        return ""
    return f"{at - pm.onset_at:+.1f} s"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(pm: IncidentPostMortem) -> str:
    """The post-mortem as Markdown (``postmortem.md``; plots are the PNG files beside it)."""
    lines = [f"# Post-mortem: incident {pm.incident_id}, {pm.alertname}", "", pm.summary, ""]
    lines += ["## Summary", "", "| measure | value |", "|---|---|"]
    lines += [f"| {k} | {_md_cell(v)} |" for k, v in summary_rows(pm)]
    lines += ["", "## Likely culprit", ""]
    lines += [f"- {_md_cell(e)}" for e in pm.culprit.evidence] or ["- no evidence"]
    if pm.culprit.chaos_fault_rank is not None:
        lines.append(f"- cross-check: the chaos journal faulted rank {pm.culprit.chaos_fault_rank}")
    lines += ["", "## Timeline", "", "| time | since onset | event | source | detail |"]
    lines.append("|---|---|---|---|---|")
    for row in pm.timeline:
        lines.append(
            f"| {format_clock(row.at)} | {_since(pm, row.at)} | {_md_cell(row.event)} | "
            f"{_md_cell(row.source)} | {_md_cell(row.detail)} |"
        )
    lines += ["", "## Plots", ""]
    for plot in pm.plots:
        lines += [f"![{plot.title} ({plot.source})]({plot.file})", ""]
    lines += ["## Alerts", ""] + [f"- {a}" for a in pm.alerts]
    lines += ["", "## Inputs", ""] + [f"- {k}: {v}" for k, v in pm.inputs.items()]
    if pm.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in pm.notes]
    return "\n".join(lines) + "\n"


_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.summary { background: #fff8e5; border-left: 4px solid #e0a800; padding: 0.6em 1em; }
small { color: #666; }
"""


def render_html(pm: IncidentPostMortem, folder: Path) -> str:
    """One self-contained HTML page (plots from ``folder`` inlined as base64 PNG, no scripts)."""
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Post-mortem: incident {pm.incident_id}, {e(pm.alertname)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Post-mortem: incident {pm.incident_id}, {e(pm.alertname)}</h1>",
        f'<p class="summary">{e(pm.summary)}</p>',
        "<h2>Summary</h2><table>",
    ]
    parts += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in summary_rows(pm)]
    parts += ["</table>", "<h2>Likely culprit</h2><ul>"]
    parts += [f"<li>{e(line)}</li>" for line in pm.culprit.evidence]
    parts += ["</ul>", "<h2>Plots</h2>"]
    for plot in pm.plots:
        uri = png_data_uri(folder / plot.file)
        parts.append(
            f'<figure><img src="{uri}" alt="{e(plot.title)}" data-plot="{e(plot.name)}">'
            f"<figcaption><small>{e(plot.title)} ({e(plot.source)})</small></figcaption></figure>"
        )
    parts.append(
        "<h2>Timeline</h2><table><tr><th>time</th><th>since onset</th><th>event</th>"
        "<th>source</th><th>detail</th></tr>"
    )
    for row in pm.timeline:
        parts.append(
            f"<tr><td>{e(format_clock(row.at))}</td><td>{e(_since(pm, row.at))}</td>"
            f"<td>{e(row.event)}</td><td>{e(row.source)}</td><td>{e(row.detail)}</td></tr>"
        )
    parts.append("</table><h2>Alerts</h2><ul>")
    parts += [f"<li>{e(a)}</li>" for a in pm.alerts]
    parts.append("</ul><h2>Inputs</h2><ul>")
    parts += [f"<li>{e(k)}: {e(v)}</li>" for k, v in pm.inputs.items()]
    parts.append("</ul>")
    if pm.notes:
        parts.append("<h2>Notes</h2><ul>")
        parts += [f"<li>{e(n)}</li>" for n in pm.notes]
        parts.append("</ul>")
    parts.append(f"<p><small>written {e(format_clock(pm.written_at))}</small></p></body></html>")
    return "\n".join(parts) + "\n"


__all__ = ["render_html", "render_markdown", "summary_rows", "write_plots"]
