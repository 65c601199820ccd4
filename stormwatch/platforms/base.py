"""The platform-backend interface and what every backend shares.

:class:`PlatformBackend` is what the responder's remedial actions and the chaos
controller's target discovery need from the platform a job runs on. Each
action call returns one human-readable line saying what it did and raises
:class:`BackendError` when it could not act; :meth:`PlatformBackend.ranks`
returns the job's placement (global rank -> node name).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from stormwatch.faults.control_file import CheckpointNow, arm
from stormwatch.platforms.errors import BackendError


@runtime_checkable
class PlatformBackend(Protocol):
    """What remedial actions and chaos target discovery need from the platform.

    Every method raises :class:`BackendError` when the job has no live worker
    (or the platform refuses); the action methods return one line of detail.
    """

    def ranks(self, job: str) -> Mapping[int, str]:
        """The job's placement: global rank -> node name (ranks whose node is unknown left out)."""
        ...

    def restart_workers(self, job: str) -> str:
        """Restart the job's worker processes (same world size)."""
        ...

    def exclude_node_and_restart(self, job: str, node: str) -> str:
        """Take ``node`` out of the job and restart it without that node."""
        ...

    def request_checkpoint(self, job: str) -> str:
        """Ask the job to save a checkpoint after its current step."""
        ...

    def collect_diagnostics(self, job: str, incident_id: int) -> str:
        """Gather stacks and state of the job's workers; returns where they went."""
        ...


#: The methods of :class:`PlatformBackend`, in the order above (contract tests use it).
BACKEND_METHODS = (
    "ranks",
    "restart_workers",
    "exclude_node_and_restart",
    "request_checkpoint",
    "collect_diagnostics",
)


def arm_checkpoint(control_file: Path, now: float) -> None:
    """Add ``{"point": "checkpoint_now", "requested_at": now}`` to the trainer's control
    file (``<control-dir>/rank<R>.json``, its model :mod:`stormwatch.faults.control_file`),
    keeping the other armed entries (chaos faults) and replacing an older
    ``checkpoint_now``; written atomically (an unreadable file is logged and replaced).

    Raises:
        OSError: the control directory cannot be created or written.
    """
    arm(
        control_file,
        CheckpointNow(point="checkpoint_now", requested_at=now),
        replacing="checkpoint_now",
    )


def write_diagnostics(directory: Path, incident_id: int, report: Mapping[str, Any]) -> Path:
    """Write ``report`` as ``<directory>/incident-<id>.json`` (folder created on demand)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"incident-{incident_id}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    return path


#: The placeholders of a control directory pattern (:func:`control_dir_for`).
CONTROL_DIR_FIELDS = ("job", "jobid", "node")


def control_dir_for(pattern: str, *, job: str, job_id: str, nodes: Sequence[str]) -> Path:
    """Rank 0's control directory: ``pattern`` with ``{job}`` (the job name), ``{jobid}``
    and ``{node}`` (the allocation's first node, which holds rank 0; the recipe's ``%n``
    in ``STORMWATCH_CONTROL_DIR``) substituted.

    Raises:
        BackendError: ``pattern`` names another placeholder (or a positional one).
    """
    try:
        return Path(pattern.format(job=job, jobid=job_id, node=nodes[0] if nodes else ""))
    except (KeyError, IndexError, ValueError) as exc:
        fields = ", ".join(f"{{{name}}}" for name in CONTROL_DIR_FIELDS)
        raise BackendError(
            f"control_dir {pattern!r}: only {fields} may be substituted ({exc!r})"
        ) from exc


def request_checkpoint_in(control_file: Path, job: str, now: float) -> str:
    """:func:`arm_checkpoint` for a backend's ``request_checkpoint``: what it did, in words.

    Raises:
        BackendError: the control file cannot be written.
    """
    try:
        arm_checkpoint(control_file, now)
    except OSError as exc:
        raise BackendError(f"cannot write the control file {control_file}: {exc}") from exc
    return f"requested a checkpoint of job {job} in {control_file}"


def report_diagnostics(
    directory: Path,
    incident_id: int,
    *,
    job: str,
    platform: str,
    now: float,
    kind: str,
    entries: list[dict[str, Any]],
) -> str:
    """Write one entry per worker (``kind``: ``workers``, ``pods``) of ``job`` with
    :func:`write_diagnostics`; what was written, in words."""
    path = write_diagnostics(
        directory, incident_id, {"job": job, "platform": platform, "time": now, kind: entries}
    )
    return f"diagnostics of {len(entries)} {kind} of job {job} in {path}"


__all__ = [
    "BACKEND_METHODS",
    "CONTROL_DIR_FIELDS",
    "PlatformBackend",
    "arm_checkpoint",
    "control_dir_for",
    "report_diagnostics",
    "request_checkpoint_in",
    "write_diagnostics",
]
