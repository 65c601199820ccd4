"""Measured detect/recover times from a game-day scorecard (``stormwatch chaos suite``).

Each scorecard row carries the failure category its fault stands for (the
experiment's ``expect.category``, else the fault kind's default; the mapping is
documented in :mod:`stormwatch.chaos.gameday.scorecard`, categories are the ids of
``llama3_table5.yaml``). Per category, over the rows that were detected and
recovered:

* ``detect_s`` = mean time to detect (fault -> first firing sample of the alert);
* ``restart_s`` = mean of ``time_to_recover - time_to_detect`` (the scorecard measures
  recovery from the fault to the first step of the restarted workers, so this
  includes the lab's own checkpoint load, which is small); ``replace_s`` 0.

Rows without a category, not detected, or not recovered by a restart (faults that
do not restart the job: a GPU XID on the simulated backend, a slowdown; their
recovery time is the fault's own duration, which says nothing of a restart) are
skipped for ``restart_s`` and listed. Categories the scorecard does not cover keep the documented defaults
of :mod:`stormwatch.plan.inputs`.
"""

from __future__ import annotations

from pathlib import Path

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.gameday.scorecard import latest_scorecard, load_scorecard
from stormwatch.plan.errors import InvalidPlanInput
from stormwatch.plan.inputs import CategoryTimes, FailureTable
from stormwatch.plan.postmortems import MeasuredTimes


def find_scorecard(run_dir: Path) -> Path | None:
    """The latest scorecard under ``run_dir`` (``suites/*/scorecard.json``), if any."""
    return latest_scorecard(run_dir)


def read_scorecard_times(path: Path, table: FailureTable) -> MeasuredTimes:
    """Per-category times measured by the scorecard at ``path``.

    ``times`` is empty when no row was detected and recovered with a category.

    Raises:
        InvalidPlanInput: unreadable scorecard, or a row names a category not in ``table``.
    """
    try:
        card = load_scorecard(path)
    except ChaosError as exc:
        raise InvalidPlanInput(f"--scorecard: {exc}") from exc
    out = MeasuredTimes()
    samples: dict[str, list[tuple[float, float]]] = {}
    for row in card.rows:
        label = f"{Path(row.file).name}"
        ttd, ttr = row.time_to_detect_seconds, row.time_to_recover_seconds
        if row.category is None:
            out.skipped.append(f"{label}: fault {row.fault_kind!r} has no failure category")
            continue
        if row.category not in table.ids:
            raise InvalidPlanInput(
                f"{path}: {label}: unknown category {row.category!r}; valid: {', '.join(table.ids)}"
            )
        if not row.detected or ttd is None:
            out.skipped.append(f"{label}: not detected")
        elif ttr is None or row.recovered_by == "fault removed":
            out.skipped.append(f"{label}: no recovery time (the job did not restart)")
        else:
            samples.setdefault(row.category, []).append((ttd, max(0.0, ttr - ttd)))
            out.used.append(f"{label}: {row.fault_kind} -> {row.category}")
    for category, pairs in samples.items():
        out.times[category] = CategoryTimes(
            detect_s=sum(d for d, _ in pairs) / len(pairs),
            restart_s=sum(r for _, r in pairs) / len(pairs),
            source=f"scorecard {card.suite_id} ({len(pairs)} experiment"
            + ("s)" if len(pairs) > 1 else ")"),
        )
    return out


__all__ = ["find_scorecard", "read_scorecard_times"]
