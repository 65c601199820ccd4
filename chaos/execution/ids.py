"""Names of experiment runs and of the jobs they start."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
import unicodedata


def job_name_for(base: str, experiment_id: str) -> str:
    """A fresh job name for one run: ``<base>-<utc time>-<hex>`` from the experiment id.

    Every run that starts its own job gets its own job folder (rank logs, checkpoints),
    so a re-run never resumes an earlier run's checkpoint. Ids not made by
    :func:`new_experiment_id` get a hash instead. At most 63 characters (the lab's limit).
    """
    match = re.fullmatch(r"(\d{8}T\d{6})-.*-([0-9a-f]{4})", experiment_id)
    if match:
        suffix = f"{match.group(1).lower()}-{match.group(2)}"
    else:
        suffix = hashlib.sha1(experiment_id.encode()).hexdigest()[:8]
    return f"{base[: 62 - len(suffix)]}-{suffix}"


def slug(text: str, limit: int, default: str) -> str:
    """``text`` as lower-case words joined by ``-``, at most ``limit`` characters, cut at a
    word's end (a first word longer than ``limit`` is cut inside it); ``default`` when
    nothing is left. ``slug("Kill rank 1 of a Lightning job", 20, "x")`` is
    ``"kill-rank-1-of-a"``, not ``"kill-rank-1-of-a-lig"`` (a fresh user's finding)."""
    # accents dropped and ligatures spelt out first (NFKD, then casefold: "Große Störung"
    # is "grosse-storung", not "gro-e-st-rung")
    plain = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    words = re.sub(r"[^a-z0-9]+", "-", plain.casefold()).strip("-")
    if len(words) > limit:
        cut = words[: limit + 1]
        words = cut[: cut.rfind("-")] if "-" in cut else words[:limit]
    return words or default


def new_experiment_id(title: str, now: float | None = None) -> str:
    """``20250101T120000-kill-rank-1a2b``: sortable, readable, unique."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{slug(title, 40, 'experiment')}-{secrets.token_hex(2)}"


__all__ = ["job_name_for", "new_experiment_id", "slug"]
