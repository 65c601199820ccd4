"""Measured detect/recover times from chaos post-mortems (``stormwatch chaos`` runs).

Reads every ``experiments/*/postmortem.json`` under a run directory (or the
directory itself if it holds ``postmortem.json`` files one level down) with the
post-mortem engine's model (:class:`stormwatch.postmortem.ExperimentPostMortem`), keeps
those with both ``time_to_detect_seconds`` and ``time_to_recover_seconds``, and
maps each ``fault_kind`` to a failure category with
:data:`stormwatch.faults.FAULT_CATEGORIES` (each kind's traits), the same mapping the
game-day scorecard uses (docs/faults.md says why each kind models its category).

Per category the mean over experiments is used: ``detect_s`` = mean time to
detect; ``restart_s`` = mean of ``time_to_recover - time_to_detect`` (the
post-mortem measures recovery from the fault to the first step after resuming,
so this includes the lab's own checkpoint load, which is small); ``replace_s`` 0.
Post-mortems of other fault kinds, or without both times, are skipped and listed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from stormwatch.faults import FAULT_CATEGORIES, category_of
from stormwatch.plan.errors import InvalidPlanInput, from_validation_error
from stormwatch.plan.inputs import CategoryTimes
from stormwatch.postmortem import ExperimentPostMortem

log = logging.getLogger(__name__)


@dataclass
class MeasuredTimes:
    """Per-category times measured from post-mortems, with what was used and skipped."""

    times: dict[str, CategoryTimes] = field(default_factory=dict)
    used: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def find_postmortems(run_dir: Path) -> list[Path]:
    """``postmortem.json`` files under ``run_dir/experiments/*/`` (else ``run_dir/*/``), sorted."""
    found = sorted(run_dir.glob("experiments/*/postmortem.json"))
    return found or sorted(run_dir.glob("*/postmortem.json"))


def read_postmortems(run_dir: Path) -> MeasuredTimes:
    """Measured detect/recover times per category from the post-mortems under ``run_dir``.

    Raises:
        InvalidPlanInput: ``run_dir`` is not a directory, a file is not valid JSON
            or has wrongly typed fields, or no post-mortem had usable times.
    """
    if not run_dir.is_dir():
        raise InvalidPlanInput(f"--from-postmortems: {run_dir} is not a directory")
    paths = find_postmortems(run_dir)
    if not paths:
        raise InvalidPlanInput(
            f"--from-postmortems: no experiments/*/postmortem.json under {run_dir} "
            "(run `stormwatch chaos run` or `stormwatch demo` first)"
        )
    out = MeasuredTimes()
    samples: dict[str, list[tuple[float, float]]] = {}
    for path in paths:
        try:
            pm = ExperimentPostMortem.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise InvalidPlanInput(f"{path}: cannot read post-mortem: {exc}") from exc
        except ValidationError as exc:
            raise from_validation_error(str(path), exc) from exc
        ttd, ttr = pm.time_to_detect_seconds, pm.time_to_recover_seconds
        category = category_of(pm.fault_kind)
        if category is None:
            out.skipped.append(f"{path.parent.name}: fault kind {pm.fault_kind!r} has no category")
        elif ttd is None or ttr is None or ttd < 0 or ttr < 0:
            out.skipped.append(f"{path.parent.name}: not both detected and recovered")
        else:
            samples.setdefault(category, []).append((ttd, max(0.0, ttr - ttd)))
            out.used.append(f"{path.parent.name}: {pm.fault_kind} -> {category}")
    for msg in out.skipped:
        log.info("post-mortem skipped: %s", msg)
    if not samples:
        raise InvalidPlanInput(
            f"--from-postmortems: none of the {len(paths)} post-mortem(s) under {run_dir} has a "
            f"known fault kind ({', '.join(sorted(FAULT_CATEGORIES))}) with both times"
        )
    for category, pairs in samples.items():
        out.times[category] = CategoryTimes(
            detect_s=sum(d for d, _ in pairs) / len(pairs),
            restart_s=sum(r for _, r in pairs) / len(pairs),
            source=f"measured ({len(pairs)} post-mortem{'s' if len(pairs) > 1 else ''})",
        )
    return out


__all__ = ["MeasuredTimes", "find_postmortems", "read_postmortems"]
