"""``stormwatch chaos postmortem``: (re)write an experiment's post-mortem."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click
from rich.console import Console

from stormwatch.chaos.cli.common import RUN_DIR, TARGET, reap_overdue
from stormwatch.chaos.errors import LabNotReady
from stormwatch.errors import ConfigError


@click.command("postmortem")
@click.argument("experiment_dir", type=click.Path(file_okay=False, path_type=Path))
@RUN_DIR
@TARGET
@click.option(
    "--baseline-log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Rank logs of the fault-free baseline job (…/jobs/<name>/logs). Default: the "
    "baseline the experiment's last post-mortem compared with, when its logs are still there.",
)
@click.option(
    "--offline",
    is_flag=True,
    help="Use the saved evidence.json instead of querying the lab's Prometheus and responder.",
)
@click.option(
    "--wait-resolved",
    type=click.FloatRange(0, 3600),
    default=0.0,
    show_default=True,
    help="Seconds to wait for the alert to be received and resolved.",
)
def postmortem_cmd(
    experiment_dir: Path,
    run_dir: Path,
    target_file: Path | None,
    baseline_log_dir: Path | None,
    offline: bool,
    wait_resolved: float,
) -> None:
    """(Re)write postmortem.md/.json for EXPERIMENT_DIR.

    EXPERIMENT_DIR is a folder (RUN_DIR/experiments/<id>) or just the experiment id,
    looked up in --run-dir.
    """
    from stormwatch.chaos.platform_target import resolve_target
    from stormwatch.chaos.reports.report import generate_postmortem

    if not experiment_dir.is_dir():
        an_id = len(experiment_dir.parts) == 1 and not experiment_dir.is_absolute()
        candidate = run_dir / "experiments" / experiment_dir
        if not (an_id and candidate.is_dir()):
            also = f" (nor {candidate})" if an_id else ""  # a path is not looked up as an id
            raise ConfigError(
                f"EXPERIMENT_DIR {experiment_dir}: no such folder{also}; give "
                "RUN_DIR/experiments/<id> or an id of an experiment in --run-dir"
            )
        experiment_dir = candidate
    if not (experiment_dir / "journal.json").is_file():
        raise ConfigError(
            f"{experiment_dir} is not an experiment directory (no journal.json); give "
            "RUN_DIR/experiments/<id> or an id of an experiment in --run-dir"
        )
    experiment_dir = experiment_dir.resolve()  # `.` or `../e1`: its run dir is two folders up

    if baseline_log_dir is None:
        baseline_log_dir = previous_baseline(experiment_dir)
        if baseline_log_dir is not None:
            click.echo(
                f"loss compared with {baseline_log_dir}, the baseline of the last post-mortem "
                "(--baseline-log-dir to choose another)",
                err=True,
            )
    if not offline:
        reap_overdue(experiment_dir.parent.parent)
    try:
        target = None if offline else resolve_target(experiment_dir.parent.parent, target_file)
    except LabNotReady as exc:  # `make demo` ends with its lab down: the files still tell
        raise LabNotReady(
            f"{exc}; or rewrite the post-mortem from the run's files alone with --offline"
        ) from exc
    _, md = asyncio.run(
        generate_postmortem(
            experiment_dir,
            target=target,
            baseline_log_dir=baseline_log_dir,
            wait_resolved_seconds=wait_resolved,
        )
    )
    text = md.read_text(encoding="utf-8")
    if sys.stdout.isatty():
        Console().print(text, markup=False, highlight=False)
    else:  # redirected (`> pm.md`): the Markdown as written, its table rows unwrapped
        click.echo(text, nl=False)


def previous_baseline(experiment_dir: Path) -> Path | None:
    """The rank logs of the baseline the experiment's last ``postmortem.json`` compared its
    loss with (``loss.baseline``, a job of the run: ``RUN_DIR/jobs/<name>/logs``), if they
    are still there; None otherwise (no post-mortem, none compared, logs gone). So that
    rewriting a post-mortem does not silently drop its loss check."""
    try:
        saved = json.loads((experiment_dir / "postmortem.json").read_text(encoding="utf-8"))
        name = saved["loss"]["baseline"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        return None
    logs = experiment_dir.parent.parent / "jobs" / name / "logs"
    return logs if logs.is_dir() else None


__all__ = ["postmortem_cmd", "previous_baseline"]
