"""The likely culprit of a failure, strongest evidence first.

1. flight recorder: in the per-rank dumps written during the incident (by every rank
   of the job; when exactly one rank wrote none, it is named, uncertain, after the
   other evidence found nothing), a rank that enqueued fewer collectives on a process
   group than its peers did, and was itself inside no collective, never issued the
   collective the others wait in (a hang, FC-10). Ranks that wait are "in flight"; the
   one that does not wait is the cause. (PyTorch's flight recorder ``pg_status``; the
   trainer's own record gives ``seconds: null`` to a collective never completed.)
2. the node agents' own diagnosis during the hang (the same flight-recorder comparison,
   made while the hang was in progress), when (1) could not compare every rank's dump.
3. rank exits (not clean) the node agents saw at the onset: the rank that died first.
   Exits from the moment the responder began to stop the job (a restart) are its own
   doing, never the cause.
4. the first alert, when it names a rank (and fired alone first).
5. straggler score (``stormwatch_rank_straggler_score`` >= :data:`STRAGGLER_FACTOR`, FC-14).
6. heartbeat: the one rank whose last step before the first alert is older than all others'.
7. XID errors on a node in the window.

The source adapters reduce what they read to the neutral :class:`Clues`
(:class:`RankDump` per dump, :class:`RankExit` per agent exit event, ...; the models live
in :mod:`.clues`); :func:`find_culprit` weighs them. It also names the phase the hang was stuck in
(:attr:`Culprit.phase`; before the first step a start-up stage: ``rendezvous``, ``mesh``,
``parallelize``, ``checkpoint_load``): the culprit's own, else the first, of the agents'
hang events that name one (:class:`RankHang`), else of the dumps (:attr:`RankDump.phase`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from stormwatch.postmortem.clues import (
    Clues,
    Culprit,
    FirstAlert,
    HangDiagnosis,
    RankDump,
    RankExit,
    RankHang,
)
from stormwatch.postmortem.progress import JobProgress, StepDone
from stormwatch.postmortem.text import alert_label, format_clock

#: Straggler score from which a rank counts as a straggler (the agent's default factor).
STRAGGLER_FACTOR = 1.2
#: Seconds before the onset a rank exit still counts as its cause (the agent sees an exit
#: up to a poll interval late; the onset may be the last progress, just after it).
EXIT_BEFORE_ONSET_S = 5.0
#: Exits within this many seconds of the first are simultaneous (the culprit is uncertain),
#: unless the first was killed by a signal and the others ended themselves with an exit
#: code: peers whose collectives failed when it died (gloo reports a dead peer in
#: milliseconds to a second: `make demo`'s rank 3 exited with code 1 0.77 s after the
#: SIGKILL of rank 1).
EXIT_TIE_S = 1.0
#: Seconds before the onset a dump still counts as the incident's (:func:`incident_dumps`):
#: the node agent asks a hung rank for its dump at the rules' threshold, and the first
#: alert (the onset of a hang before any step) follows a scrape and a rule evaluation
#: later, up to two minutes at Prometheus's default intervals (1 m each).
DUMP_LEAD_S = 120.0
#: Seconds after the responder's stop a rank's dump is still its dump at the stop
#: (:func:`incident_dumps`): a thread writes it the moment SIGTERM arrives
#: (:mod:`stormwatch.telemetry.lifecycle.sigterm`), which follows the stop by the action's
#: own checks (a Prometheus query of up to 5 s) and the scheduler's call, while a restarted
#: attempt dumps only once the old processes are gone and the new ones have started and
#: imported torch (0.7-1.9 s to start, then 2.5 CPU-s, in README "Recovery").
STOP_DUMP_S = 10.0


def _scores_line(scores: dict[str, float]) -> str:
    """The straggler scores with what they are (fresh-user pass: four scores above 1.2 read
    as four stragglers): each rank's highest in the window, so a restart's slow steps count."""
    listed = ", ".join(f"{k} {v:.2f}" for k, v in sorted(scores.items()))
    return (
        f"straggler scores (each rank's highest in the window; a score is a step's compute "
        f"time over its node peers' median, and a straggler is one at >= {STRAGGLER_FACTOR:g} "
        f"several steps in a row, not one high step such as a restart's): {listed}"
    )


def compare_dumps(dumps: Iterable[RankDump]) -> list[RankDump]:
    """Fill each dump's ``behind`` (per process group, vs. the furthest peer) and
    ``overtaken`` (inside a collective a peer completed); by rank."""
    ranks = sorted(dumps, key=lambda d: d.rank)
    groups = sorted({name for d in ranks for name in d.enqueued})
    for name in groups:
        counts = [d.enqueued[name] for d in ranks if name in d.enqueued]
        if len(counts) < 2:
            continue
        top = max(counts)
        done = max((d.completed[name] for d in ranks if name in d.completed), default=None)
        for dump in ranks:
            mine = dump.enqueued.get(name)
            if mine is not None and mine < top:
                dump.behind[name] = top - mine
            inside = mine is not None and name in _inside(dump)
            if inside and done is not None and done >= mine and name not in dump.overtaken:
                dump.overtaken.append(name)
    return ranks


def incident_dumps(
    dumps: Iterable[RankDump], *, since: float | None, stopped_at: float | None
) -> list[RankDump]:
    """The one dump per rank an incident's culprit is drawn from, by rank.

    ``dumps``: every dump read around the incident, of every attempt. Without a stop
    (``stopped_at`` None) each rank's latest. With one (the moment the responder began to
    stop the job's ranks, a restart): each rank's latest written from ``since`` (None: no
    bound; :data:`DUMP_LEAD_S` before the onset) until the stop, taken while the incident
    lasted (a dump request's answer during a hang, a failed collective's dump); a rank
    with none there, its first written within :data:`STOP_DUMP_S` of the stop (its SIGTERM
    dump); a rank with neither is left out (a later dump is a restarted attempt's, which
    compared with the hung attempt's would name the wrong rank), unless no rank has one,
    when each rank's latest is read.

    A dump taken at the stop may no longer show a hang: on SIGTERM, PyTorch Lightning's
    handler on the hung rank issues a broadcast that can level it with its peers, and
    Slurm's SIGCONT lets a stopped rank run on into the collective its peers wait in.
    """
    ordered = sorted(dumps, key=lambda d: d.time if d.time is not None else float("-inf"))
    latest = {d.rank: d for d in ordered}
    if stopped_at is None:
        return [latest[r] for r in sorted(latest)]
    chosen: dict[int, RankDump] = {}
    for dump in ordered:
        when = dump.time
        if when is not None and (since is None or when >= since) and when < stopped_at:
            chosen[dump.rank] = dump
    for dump in ordered:
        when = dump.time
        if dump.rank in chosen or when is None:
            continue
        if stopped_at <= when < stopped_at + STOP_DUMP_S:
            chosen[dump.rank] = dump
    if not chosen:
        return [latest[r] for r in sorted(latest)]
    return [chosen[r] for r in sorted(chosen)]


def _inside(dump: RankDump) -> set[str]:
    """The groups whose last enqueued collective ``dump``'s rank has not completed (a
    completed seq below 0 is unknown, as the telemetry's ``reduce_dump`` reads it)."""
    return {
        g
        for g, n in dump.enqueued.items()
        if dump.completed.get(g, -1) >= 0 and n > dump.completed[g]
    }


def _unissued(dump: RankDump) -> dict[str, int]:
    """The groups where ``dump``'s rank is behind, less those its lag is explained on:
    * it is inside a collective of *another* group: it waits there, and issues the rest when
      that completes (the game day's hung rank: rank 3, inside its data-parallel all-reduce
      with the hung rank 1, was behind rank 2 on their tensor-parallel group);
    * it is inside a collective of that group a peer has completed: a ring all-reduce
      completes on some ranks before a peer stops and leaves the others in it (CI cc14).
    Behind inside the one collective no peer completed stays evidence (an NCCL rank whose
    kernel never ran while its peers enqueued the next)."""
    inside = _inside(dump)
    return {g: n for g, n in dump.behind.items() if g not in dump.overtaken and not inside - {g}}


def _flight_recorder(dumps: Sequence[RankDump]) -> Culprit | None:
    lagging = [d for d in dumps if _unissued(d)]
    if len(dumps) < 2 or not lagging:
        return None
    never_joined = [d for d in lagging if not d.in_flight]
    pool = never_joined or lagging
    top = max(sum(_unissued(d).values()) for d in pool)
    chosen = [d for d in pool if sum(_unissued(d).values()) == top]
    best = chosen[0]
    evidence = [
        f"rank {best.rank} never issued the collective its peers wait in: it is behind "
        f"on {len(_unissued(best))} process group(s)"
        + (" and was inside no collective itself" if not best.in_flight else "")
    ]
    for dump in dumps:
        state = "waiting inside a collective" if dump.in_flight else "inside no collective"
        behind = ", ".join(
            f"group {g}: {n} fewer"
            + (" (inside a collective a peer completed)" if g in dump.overtaken else "")
            for g, n in sorted(dump.behind.items())
        )
        evidence.append(
            f"flight recorder, rank {dump.rank}: {state}; "
            + (f"enqueued fewer collectives than its peers ({behind})" if behind else "not behind")
            + f"; dump reason: {dump.reason[:120] or '?'}"
        )
    return Culprit(
        rank=best.rank,
        method="flight_recorder",
        certain=len(chosen) == 1 and bool(never_joined),
        evidence=evidence,
    )


def culprit_from_dumps(dumps: Iterable[RankDump], asked: Iterable[int]) -> Culprit | None:
    """The culprit of a hang still in progress, from the dumps of the ranks ``asked`` for
    one (the node agent's hang diagnosis); None when the dumps name no rank.

    When every rank asked answered, the flight-recorder comparison decides (a rank behind
    its peers and inside no collective). When some did not answer, and every rank that did
    waits inside a collective, the silent ones are what the others wait for: a rank that
    is stopped, or hung where even a thread of it cannot run, cannot answer (a dead one
    would have been seen exiting). Certain when exactly one rank is silent; a rank named
    by the comparison while others are silent is uncertain, and so is a silent rank when
    a rank that answered waits in no collective and the comparison names no one.
    """
    compared = compare_dumps(dumps)
    if not compared:
        return None
    silent = sorted(set(asked) - {d.rank for d in compared})
    found = _flight_recorder(compared)
    if not silent:
        return found
    all_wait = all(d.in_flight for d in compared)
    if found is not None and not all_wait:  # a silent rank might be part of it
        found.certain = False
        found.evidence.append(f"rank(s) {', '.join(map(str, silent))} did not answer")
        return found
    quiet = ", ".join(map(str, silent))
    answered = ", ".join(str(d.rank) for d in compared)
    evidence = [
        f"rank(s) {quiet} did not answer the dump request, while rank(s) {answered} wait "
        "inside a collective: they wait for the silent one(s), which are stopped or hung "
        "where no thread of theirs runs"
        if all_wait
        else f"rank(s) {quiet} did not answer the dump request, and the dumps of rank(s) "
        f"{answered} name no one: the silent one(s) are the likely cause"
    ]
    for dump in compared:
        groups = ", ".join(
            f"group {g}: last enqueued #{n}" for g, n in sorted(dump.enqueued.items())
        )
        state = "waiting inside a collective" if dump.in_flight else "inside no collective"
        evidence.append(f"flight recorder, rank {dump.rank}: {state} ({groups})")
    return Culprit(
        rank=silent[0] if len(silent) == 1 else None,
        method="flight_recorder",
        certain=len(silent) == 1 and all_wait,
        evidence=evidence,
    )


def _hang_diagnosis(diagnoses: Sequence[HangDiagnosis]) -> Culprit | None:
    """The rank the agents named during the hang; certain when each agent that named one
    named the same rank and at least one was certain."""
    if not diagnoses:
        return None
    named = {d.rank for d in diagnoses}
    best = next((d for d in diagnoses if d.certain), diagnoses[0])
    return Culprit(
        rank=best.rank,
        node=best.node,
        method="flight_recorder",
        certain=len(named) == 1 and any(d.certain for d in diagnoses),
        evidence=[
            f"agent on {d.node} at {format_clock(d.time)}, during the hang: rank {d.rank}"
            + (" (certain)" if d.certain else " (uncertain)")
            + (f": {d.evidence[0]}" if d.evidence else "")
            for d in diagnoses[:4]
        ]
        + [line for line in best.evidence[1:6]],
    )


def _rank_exit(
    exits: Sequence[RankExit], onset: float | None, stopped_at: float | None
) -> Culprit | None:
    if stopped_at is not None:  # the responder's restart ended these: its doing, not a clue
        exits = [e for e in exits if e.time < stopped_at]
    if onset is not None:
        exits = [e for e in exits if e.time >= onset - EXIT_BEFORE_ONSET_S]
    if not exits:
        return None
    first = exits[0]
    others = [e for e in exits if e.time - first.time < EXIT_TIE_S and e.rank != first.rank]
    victims = bool(others) and first.killed and not any(e.killed for e in others)
    evidence = [
        f"agent on {e.node}: rank {e.rank} {e.how} at {format_clock(e.time)}" for e in exits[:5]
    ]
    if victims:
        names = ", ".join(str(e.rank) for e in others)
        evidence.append(
            f"rank {first.rank} was killed; rank {names}, which exited within a second after "
            "it, ended itself (its collectives failed)"
            if len(others) == 1
            else f"rank {first.rank} was killed; ranks {names}, which exited within a second "
            "after it, ended themselves (their collectives failed)"
        )
    return Culprit(
        rank=first.rank,
        node=first.node,
        method="rank_exit",
        certain=not others or victims,
        evidence=evidence,
    )


def _int(value: object) -> int | None:
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,30}", value):
        return int(value)  # not isdigit(): it takes "--5" and "²", which int() refuses
    return None


def _alert_rank(first: FirstAlert) -> Culprit | None:
    rank = _int(first.labels.get("rank"))
    if rank is None:
        return None
    return Culprit(
        rank=rank,
        node=first.labels.get("node"),
        method="alert",
        certain=not first.tied,
        evidence=[
            f"the first alert, {alert_label(first.alertname, first.labels)}, names rank {rank}"
        ],
    )


def _straggler(scores: Mapping[str, float]) -> Culprit | None:
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


def _heartbeat(progress: JobProgress, before: float) -> Culprit | None:
    last: dict[int, StepDone] = {}
    for rank, ranks in progress.items():
        step = ranks.last_step_before(before)
        if step is not None:
            last[rank] = step
    if len(last) < 2:
        return None
    oldest = min(last.values(), key=lambda s: (s.step or 0, s.time))
    others = [s for s in last.values() if s is not oldest]
    if not all((s.step or 0) > (oldest.step or 0) for s in others):
        return None
    rank = next(r for r, s in last.items() if s is oldest)
    return Culprit(
        rank=rank,
        method="heartbeat",
        certain=True,
        evidence=[
            f"rank {rank}'s last step before the alert was {oldest.step}; the other ranks "
            f"reached {', '.join(str(s.step) for s in others)}"
        ],
    )


def _xid(errors: Mapping[str, float]) -> Culprit | None:
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


def find_culprit(clues: Clues) -> Culprit:
    """The strongest available culprit (see the module docstring); ``unknown`` without evidence.

    The flight-recorder comparison is used only when every rank of the job wrote a
    dump: a rank that died without one (SIGKILL) leaves its peers' counters uneven in
    ways that point at a survivor.
    """
    scores = clues.straggler_scores
    have = {d.rank for d in clues.dumps}
    missing = sorted(r for r in clues.progress if r not in have) if clues.dumps else []
    found = (
        (None if missing else _flight_recorder(clues.dumps))
        or _hang_diagnosis(clues.hang_diagnoses)
        or _rank_exit(clues.rank_exits, clues.onset, clues.stopped_at)
        or _alert_rank(clues.first_alert)
        or _straggler(scores)
        or _heartbeat(clues.progress, clues.first_alert_at)
        or _xid(clues.xid_errors)
        or _no_dump(missing)
        or Culprit(evidence=["no flight-recorder dump, rank exit, rank alert or straggler"])
    )
    if found.node is None and found.rank is not None:
        found.node = clues.rank_nodes.get(found.rank)
    if scores and found.method != "straggler":
        found.evidence.append(_scores_line(scores))
    if missing and found.method != "flight_recorder":
        found.evidence.append(
            f"flight recorder not compared: rank(s) {', '.join(map(str, missing))} wrote no dump"
        )
    if clues.chaos_fault_ranks:
        found.chaos_fault_rank = clues.chaos_fault_ranks[-1]
    stuck = stuck_phase(clues.rank_hangs, clues.dumps, found.rank)
    if stuck is not None:
        found.phase, line = stuck
        found.evidence.append(line)
    return found


def stuck_phase(
    hangs: Sequence[RankHang], dumps: Sequence[RankDump], rank: int | None
) -> tuple[str, str] | None:
    """``(phase, evidence line)``: where the hang was stuck. The hang event of ``rank`` (the
    culprit) naming a phase, else the first naming one; else the dump of ``rank`` naming
    one, else the first; None when nothing names a phase."""
    named = [h for h in hangs if h.phase]
    hang = next((h for h in named if h.rank == rank), named[0] if named else None)
    if hang is not None and hang.phase is not None:
        return hang.phase, (
            f"agent on {hang.node} at {format_clock(hang.time)}: rank {hang.rank} hung in "
            f"{_phase_words(hang.phase)}, past its bound"
        )
    with_phase = [d for d in dumps if d.phase]
    dump = next((d for d in with_phase if d.rank == rank), with_phase[0] if with_phase else None)
    if dump is not None and dump.phase is not None:
        return dump.phase, f"rank {dump.rank}'s dump: it was in {_phase_words(dump.phase)}"
    return None


#: The start-up stages (:data:`stormwatch.telemetry.phases.STARTUP_STAGES`, not imported:
#: the engine imports no rank-side package), as the evidence words them.
_STARTUP_STAGES = ("rendezvous", "mesh", "parallelize", "checkpoint_load")


def _phase_words(phase: str) -> str:
    """``start-up stage mesh`` or ``phase eval``."""
    return f"start-up stage {phase}" if phase in _STARTUP_STAGES else f"phase {phase}"


__all__ = [
    "DUMP_LEAD_S",
    "EXIT_BEFORE_ONSET_S",
    "STOP_DUMP_S",
    "STRAGGLER_FACTOR",
    "compare_dumps",
    "culprit_from_dumps",
    "find_culprit",
    "incident_dumps",
    "stuck_phase",
]
