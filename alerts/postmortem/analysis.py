"""From :class:`~.sources.Inputs` to :class:`~.model.IncidentPostMortem`: times, impact, culprit.

Culprit, strongest evidence first:

1. flight recorder: in the per-rank dumps written during the incident (by every
   rank of the job; when exactly one rank wrote none, it is named, uncertain, after
   the other evidence found nothing), a rank
   that enqueued fewer collectives on a process group than its peers did, and
   was itself inside no collective, never issued the collective the others
   wait in (a hang, FC-10). Ranks that wait are "in flight"; the one that does
   not wait is the cause. (PyTorch's flight recorder ``pg_status``; the
   trainer's own record gives ``seconds: null`` to a collective never completed.)
2. agent ``rank_exit`` events (not clean) at the onset: the rank that died first.
3. the incident's first alert, when it names a rank (and fired alone first).
4. straggler score (``stormwatch_rank_straggler_score`` >= 1.2, FC-14).
5. heartbeat: the one rank whose last step before the onset is older than all others'.
6. XID errors on a node in the window.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stormwatch.agent.watch.events import RankExitEvent
from stormwatch.agent.watch.proc_exits import signal_name
from stormwatch.alerts.postmortem.model import Culprit, RankDump
from stormwatch.alerts.postmortem.sources import Inputs
from stormwatch.chaos.reports.postmortem import format_clock
from stormwatch.trainer.telemetry.events import StepEvent

#: Straggler score from which a rank counts as a straggler (the agent's default factor).
STRAGGLER_FACTOR = 1.2
#: A chaos fault this long before the first alert still counts as its onset (s).
JOURNAL_MATCH_S = 600.0
#: Timeline rows kept per source (the rest are counted in a note).
MAX_EVENTS_PER_SOURCE = 25


def _labels(labels: dict[str, str]) -> str:
    keys = ("job", "rank", "node", "severity")
    inner = ", ".join(f"{k}={labels[k]}" for k in keys if k in labels)
    return f"{{{inner}}}" if inner else ""


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


# -- flight recorder ---------------------------------------------------------------------------


def reduce_dump(data: dict[str, Any]) -> RankDump:
    """The parts of one trainer dump (trainer/telemetry/dump.py) that compare across ranks."""
    dump = RankDump(
        rank=int(data["rank"]),
        attempt=_int(data.get("attempt")),
        time=float(data["time"]) if isinstance(data.get("time"), (int, float)) else None,
        reason=str(data.get("reason") or "")[:300],
        step=_int(data.get("step")),
    )
    recorder = data.get("flight_recorder")
    if isinstance(recorder, dict):
        for name, status in (recorder.get("pg_status") or {}).items():
            if not isinstance(status, dict):
                continue
            enqueued = _int(status.get("last_enqueued_collective"))
            completed = _int(status.get("last_completed_collective"))
            if enqueued is None:
                continue
            dump.enqueued[str(name)] = enqueued
            if completed is not None and completed >= 0 and enqueued > completed:
                dump.in_flight = True
    for collective in data.get("collectives") or []:
        if isinstance(collective, dict) and collective.get("seconds", 0.0) is None:
            dump.in_flight = True
    return dump


def compare_dumps(dumps: Iterable[RankDump]) -> list[RankDump]:
    """Fill each dump's ``behind`` (per process group, vs. the furthest peer); by rank."""
    ranks = sorted(dumps, key=lambda d: d.rank)
    groups = {name for d in ranks for name in d.enqueued}
    for name in groups:
        counts = [d.enqueued[name] for d in ranks if name in d.enqueued]
        if len(counts) < 2:
            continue
        top = max(counts)
        for dump in ranks:
            mine = dump.enqueued.get(name)
            if mine is not None and mine < top:
                dump.behind[name] = top - mine
    return ranks


def _flight_recorder(dumps: list[RankDump]) -> Culprit | None:
    lagging = [d for d in dumps if d.behind]
    if len(dumps) < 2 or not lagging:
        return None
    never_joined = [d for d in lagging if not d.in_flight]
    pool = never_joined or lagging
    top = max(sum(d.behind.values()) for d in pool)
    chosen = [d for d in pool if sum(d.behind.values()) == top]
    best = chosen[0]
    evidence = []
    for dump in dumps:
        state = "waiting inside a collective" if dump.in_flight else "inside no collective"
        behind = ", ".join(f"group {g}: {n} fewer" for g, n in sorted(dump.behind.items()))
        evidence.append(
            f"flight recorder, rank {dump.rank}: {state}; "
            + (f"enqueued fewer collectives than its peers ({behind})" if behind else "not behind")
            + f"; dump reason: {dump.reason[:120] or '?'}"
        )
    evidence.insert(
        0,
        f"rank {best.rank} never issued the collective its peers wait in: it is behind "
        f"on {len(best.behind)} process group(s)"
        + (" and was inside no collective itself" if not best.in_flight else ""),
    )
    return Culprit(
        rank=best.rank,
        method="flight_recorder",
        certain=len(chosen) == 1 and bool(never_joined),
        evidence=evidence,
    )


# -- other evidence ----------------------------------------------------------------------------


def _rank_exit(inputs: Inputs, onset: float | None) -> Culprit | None:
    exits = [e for e in inputs.agent_events if isinstance(e, RankExitEvent) and not e.clean]
    if onset is not None:
        exits = [e for e in exits if e.time >= onset - 5.0]
    if not exits:
        return None
    first = exits[0]
    tied = [e for e in exits if e.time - first.time < 1.0]
    return Culprit(
        rank=first.rank,
        node=first.node,
        method="rank_exit",
        certain=len({e.rank for e in tied}) == 1,
        evidence=[
            f"agent on {e.node}: rank {e.rank} {exit_status(e)} at {format_clock(e.time)}"
            for e in exits[:5]
        ],
    )


def exit_status(event: RankExitEvent) -> str:
    """How a ``rank_exit`` agent event says the rank ended, in words.

    ``killed by SIGKILL`` (``exit_signal``, or a negative ``exit_code``), ``exited with code
    143 (128 + SIGTERM: the process ended itself on that signal)``, ``exited with code 1``,
    or ``exited (status unknown: the agent saw no exit event)``.
    """
    code, sig = event.exit_code, event.exit_signal
    if sig:
        return f"was killed by {sig}"
    if code is not None and code < 0:
        return f"was killed by {signal_name(-code)}"
    if code is not None and code > 128:
        return (
            f"exited with code {code} (128 + {signal_name(code - 128)}: "
            "the process ended itself on that signal)"
        )
    if code is not None:
        return f"exited with code {code}"
    return "exited (status unknown: the agent saw no exit event)"


def _alert_rank(inputs: Inputs) -> Culprit | None:
    first = inputs.incident.first_alert
    rank = _int(first.labels.get("rank"))
    if rank is None:
        return None
    return Culprit(
        rank=rank,
        node=first.labels.get("node"),
        method="alert",
        certain=not inputs.incident.first_alert_tied,
        evidence=[f"the first alert, {first.alertname}{_labels(first.labels)}, names rank {rank}"],
    )


def _straggler(scores: dict[str, float]) -> Culprit | None:
    ranked = sorted(((v, k) for k, v in scores.items() if v >= STRAGGLER_FACTOR), reverse=True)
    if not ranked:
        return None
    _, key = ranked[0]
    return Culprit(
        rank=_int(key.removeprefix("rank=")),
        method="straggler",
        certain=len(ranked) == 1,
        evidence=[f"straggler score {v:.2f} ({k})" for v, k in ranked[:5]],
    )


def _last_steps(inputs: Inputs, before: float) -> dict[int, StepEvent]:
    last: dict[int, StepEvent] = {}
    for rank, log in inputs.rank_logs.items():
        steps = [e for e in log.steps if e.time <= before]
        if steps:
            last[rank] = steps[-1]
    return last


def _heartbeat(inputs: Inputs, before: float) -> Culprit | None:
    last = _last_steps(inputs, before)
    if len(last) < 2:
        return None
    oldest = min(last.values(), key=lambda e: (e.step or 0, e.time))
    others = [e for r, e in last.items() if e is not oldest]
    if not all((e.step or 0) > (oldest.step or 0) for e in others):
        return None
    rank = next(r for r, e in last.items() if e is oldest)
    return Culprit(
        rank=rank,
        method="heartbeat",
        certain=True,
        evidence=[
            f"rank {rank}'s last step before the alert was {oldest.step}; the other ranks "
            f"reached {', '.join(str(e.step) for e in others)}"
        ],
    )


def _xid(errors: dict[str, float]) -> Culprit | None:
    if not errors:
        return None
    key = max(errors, key=lambda k: errors[k])
    node = next((p.removeprefix("node=") for p in key.split() if p.startswith("node=")), None)
    return Culprit(
        node=node,
        method="xid",
        certain=len(errors) == 1,
        evidence=[f"XID errors in the window: {k}: {v:g}" for k, v in errors.items()],
    )


def _missing_dumps(inputs: Inputs, dumps: list[RankDump]) -> list[int]:
    """Ranks of the job (by its rank logs) that wrote no dump during the incident."""
    have = {d.rank for d in dumps}
    return sorted(r for r in inputs.rank_logs if r not in have) if dumps else []


def _no_dump(missing: list[int]) -> Culprit | None:
    if len(missing) != 1:
        return None
    return Culprit(
        rank=missing[0],
        method="flight_recorder",
        certain=False,
        evidence=[
            f"rank {missing[0]} is the only rank that wrote no dump: it died without "
            "running its handlers (SIGKILL, OOM kill, segfault) or hung where no signal reaches"
        ],
    )


def find_culprit(inputs: Inputs, dumps: list[RankDump], onset: float | None) -> Culprit:
    """The strongest available culprit (see the module docstring); ``unknown`` without evidence.

    The flight-recorder comparison is used only when every rank of the job wrote a
    dump: a rank that died without one (SIGKILL) leaves its peers' counters
    uneven in ways that point at a survivor.
    """
    scores = inputs.prometheus_now.get("straggler_score", {})
    missing = _missing_dumps(inputs, dumps)
    found = (
        (None if missing else _flight_recorder(dumps))
        or _rank_exit(inputs, onset)
        or _alert_rank(inputs)
        or _straggler(scores)
        or _heartbeat(inputs, inputs.incident.starts_at)
        or _xid(inputs.prometheus_now.get("xid_errors", {}))
        or _no_dump(missing)
        or Culprit(evidence=["no flight-recorder dump, rank exit, rank alert or straggler"])
    )
    if found.node is None and found.rank is not None:
        found.node = inputs.rank_nodes.get(found.rank)
    if scores and found.method != "straggler":
        found.evidence.append(f"straggler scores: {_scores(scores)}")
    if missing and found.method != "flight_recorder":
        found.evidence.append(
            f"flight recorder not compared: rank(s) {', '.join(map(str, missing))} wrote no dump"
        )
    for journal in inputs.journals:
        for fault in journal.injected_faults():
            found.chaos_fault_rank = fault.rank
    return found


def _scores(scores: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(scores.items()))
