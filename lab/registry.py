"""The host-wide registry of labs: which run directory owns which name prefix.

Kernel objects (namespaces, veths, the bridge) are host-wide and named by the
lab's prefix, but each lab's state lives in its own run directory. So that a
``lab down`` with a mistyped ``--run-dir`` cannot take apart another lab that
uses the same prefix, ``lab up`` records ``<REGISTRY_DIR>/<prefix>.json``
(pointing to its run directory) before it creates anything, and ``lab down``
removes it once everything is gone.

The directory defaults to :data:`DEFAULT_REGISTRY_DIR` (``/run/stormwatch/labs``,
cleared at boot like the namespaces themselves); the environment variable
``STORMWATCH_LAB_REGISTRY`` overrides it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)

#: Where the registry lives unless ``STORMWATCH_LAB_REGISTRY`` says otherwise.
DEFAULT_REGISTRY_DIR = Path("/run/stormwatch/labs")
REGISTRY_ENV = "STORMWATCH_LAB_REGISTRY"


class LabClaim(BaseModel):
    """One registry entry: the lab with ``prefix`` belongs to ``run_dir``."""

    prefix: str
    run_dir: Path
    pid: int
    claimed_at: float


def registry_dir() -> Path:
    """The registry directory (``STORMWATCH_LAB_REGISTRY`` or :data:`DEFAULT_REGISTRY_DIR`)."""
    return Path(os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY_DIR)


def _path(prefix: str) -> Path:
    return registry_dir() / f"{prefix}.json"


def owner(prefix: str) -> LabClaim | None:
    """The claim on ``prefix``, or ``None`` (no entry, or an unreadable one, which is logged)."""
    try:
        text = _path(prefix).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read the lab registry entry %s: %s", _path(prefix), exc)
        return None
    try:
        return LabClaim.model_validate_json(text)
    except ValidationError:
        log.warning("ignoring a corrupt lab registry entry %s", _path(prefix))
        return None


def claim(prefix: str, run_dir: Path) -> None:
    """Record that ``run_dir`` owns ``prefix`` (atomically; replaces an earlier claim)."""
    path = _path(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = LabClaim(prefix=prefix, run_dir=run_dir, pid=os.getpid(), claimed_at=time.time())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(entry.model_dump_json(indent=2))
    os.replace(tmp, path)


def release(prefix: str, run_dir: Path) -> None:
    """Remove the claim on ``prefix`` if ``run_dir`` holds it (another lab's claim is kept)."""
    current = owner(prefix)
    if current is not None and current.run_dir == run_dir:
        _path(prefix).unlink(missing_ok=True)


__all__ = [
    "DEFAULT_REGISTRY_DIR",
    "REGISTRY_ENV",
    "LabClaim",
    "claim",
    "owner",
    "registry_dir",
    "release",
]
