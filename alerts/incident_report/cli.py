"""``stormwatch alerts postmortem INCIDENT``: write an incident's post-mortem again."""

from __future__ import annotations

import os
from pathlib import Path

import click

from stormwatch.alerts.errors import NotAResponderDatabase
from stormwatch.alerts.responder.schema import EXPECTED
from stormwatch.alerts.responder.store import Store
from stormwatch.errors import ConfigError
from stormwatch.platforms import (
    InvalidTargetFile,
    TargetFile,
    lab_target_path,
    read_lab_target,
)
from stormwatch.platforms.slurm import SlurmCommands

_LAB_DIR = Path(os.environ.get("STORMWATCH_LAB_DIR", "run"))


@click.command("postmortem")
@click.argument("incident_id", metavar="INCIDENT", type=int)
@click.option(
    "--db",
    "db_path",
    default=str(_LAB_DIR / "responder" / "responder.sqlite"),
    show_default=True,
    type=click.Path(path_type=Path),
    help="The responder's database (the local lab's by default).",
)
@click.option(
    "--lab-run-dir",
    default=None,
    type=click.Path(path_type=Path),
    help="The lab's run directory (rank logs, dumps, spans, agent events, chaos journals) "
    "[default: $STORMWATCH_LAB_DIR or ./run when --db is the lab's].",
)
@click.option(
    "--prometheus-url",
    default=None,
    help="Prometheus for the plots and straggler/XID evidence [default: the lab's, when "
    "--lab-run-dir has the target file `lab up` writes]; without one the plots come from "
    "the rank logs. On the Slurm lab Slurm's job and node history is read too.",
)
@click.option(
    "-o",
    "--postmortem-dir",
    default=None,
    type=click.Path(path_type=Path),
    help="Parent of incident-<id>/ [default: <db folder>/postmortems, where the responder "
    "writes them].",
)
def postmortem_cmd(
    incident_id: int,
    db_path: Path,
    lab_run_dir: Path | None,
    prometheus_url: str | None,
    postmortem_dir: Path | None,
) -> None:
    """Write (again) the post-mortem of INCIDENT: Markdown, one self-contained HTML file
    and JSON in <postmortem-dir>/incident-<id>/ (the responder writes it by itself when
    the incident closes)."""
    from stormwatch.alerts.incident_report import write_incident_postmortem

    if not db_path.is_file():
        what = "is a folder, not a file" if db_path.is_dir() else "does not exist"
        raise ConfigError(f"--db: {db_path} {what}; {EXPECTED}")
    try:  # read-only first: a wrong file is named, never given the responder's tables
        Store.open_readonly(db_path).close()
    except NotAResponderDatabase as exc:
        raise NotAResponderDatabase(f"--db: {exc}") from exc
    if lab_run_dir is None and lab_target_path(db_path.resolve().parent.parent).is_file():
        lab_run_dir = db_path.resolve().parent.parent
    target = _lab_target(lab_run_dir) if lab_run_dir is not None else None
    if prometheus_url is None and lab_run_dir is not None:
        prometheus_url = _lab_prometheus(lab_run_dir)
    files = write_incident_postmortem(
        db_path=db_path,
        incident_id=incident_id,
        postmortem_dir=postmortem_dir or db_path.parent / "postmortems",
        lab_run_dir=lab_run_dir,
        prometheus_url=prometheus_url,
        slurm=_slurm_of(target),
    )
    click.echo(files.postmortem.summary)
    for path in (files.markdown, files.html, files.json):
        click.echo(f"wrote {path}")


def _lab_target(run_dir: Path) -> TargetFile | None:
    """The target file ``lab up`` wrote in ``run_dir`` (None without a readable one: the
    plots then use the rank logs, and no Slurm history is read)."""
    try:
        return read_lab_target(run_dir)
    except InvalidTargetFile:
        return None


def _lab_prometheus(run_dir: Path) -> str | None:
    """The lab's Prometheus, from the target file ``lab up`` wrote in ``run_dir`` (None
    without a readable one or without a ``prometheus`` section: plots use the rank logs)."""
    target = _lab_target(run_dir)
    return target.prometheus.url if target is not None and target.prometheus else None


def _slurm_of(target: TargetFile | None) -> SlurmCommands | None:
    """The Slurm lab's command client (its ``slurm.conf``), for Slurm's job and node history
    in the post-mortem, as the responder reads it; None for a lab that runs no Slurm."""
    if target is None or target.platform != "slurm":
        return None
    return SlurmCommands(conf=target.slurm.conf)


__all__ = ["postmortem_cmd"]
