"""What the ``stormwatch chaos`` commands share: the ``--run-dir`` option, counted words, and
reverting overdue faults before a command acts."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from stormwatch.chaos.ledger.revert import RevertOutcome, revert_overdue

RUN_DIR = click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("run"),
    envvar="STORMWATCH_LAB_DIR",
    show_default=True,
    show_envvar=True,
    help="The lab's run directory (lab.json, fault ledger, experiments/).",
)


TARGET = click.option(
    "--target",
    "target_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="STORMWATCH_TARGET",
    show_envvar=True,
    help="Target file: the cluster to act on (platform, Prometheus, agents, job); "
    "default: RUN_DIR/target.yaml when `lab up` wrote one, else the lab in --run-dir.",
)


def reap_overdue(run_dir: Path) -> list[RevertOutcome]:
    """Revert faults past their TTL in ``run_dir``'s ledger (their controller and reaper
    died) and say so on stderr; every command that takes --run-dir does this first."""
    outcomes = revert_overdue(run_dir)
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    for outcome in outcomes:
        if outcome.ok:
            console.print(
                f"[yellow]reverted overdue fault[/] {outcome.fault_id} "
                f"(past its TTL; its controller and reaper are gone): {escape(outcome.detail)}"
            )
        else:
            console.print(
                f"[red]overdue fault {outcome.fault_id} could not be reverted:[/] "
                f"{escape(outcome.detail)}"
            )
    return outcomes


__all__ = ["RUN_DIR", "TARGET", "reap_overdue"]
