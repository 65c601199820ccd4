"""``stormwatch chaos revert`` and ``stormwatch chaos ledger``: the fault ledger from the command line."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stormwatch.chaos.cli.common import RUN_DIR, reap_overdue
from stormwatch.chaos.errors import ChaosError, LedgerError
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.ledger.revert import RevertOutcome, revert_entries
from stormwatch.contracts.fault_ledger import LedgerEntry
from stormwatch.errors import ConfigError

#: Where ``stormwatch demo`` keeps its run (hinted when the default run dir has no ledger).
_DEMO_RUN_DIR = Path("run/demo")


@click.command()
@click.option("--all", "all_", is_flag=True, help="Revert every open fault in the ledger.")
@click.argument("fault_ids", nargs=-1)
@RUN_DIR
def revert(all_: bool, fault_ids: tuple[str, ...], run_dir: Path) -> int:
    """Revert open faults recorded in the ledger (idempotent; safe after a controller crash).

    Give --all or FAULT_IDS. Exit 1 when a fault could not be reverted (it stays
    open in the ledger; the agent still reverts it at its TTL).
    """
    if all_ and fault_ids:
        raise ConfigError(
            f"--all and FAULT_IDS ({' '.join(fault_ids)}) together: give one of them "
            "(the run directory is --run-dir, e.g. `stormwatch chaos revert --all --run-dir run`)"
        )
    if not all_ and not fault_ids:
        raise ConfigError("nothing to revert: give --all or one or more FAULT_IDS")
    reap_overdue(run_dir)
    path = ledger_path(run_dir)
    console = Console()
    if not path.exists():
        if fault_ids:  # named faults cannot be in a ledger that does not exist
            raise ConfigError(
                f"no fault ledger at {path}, so no fault {', '.join(fault_ids)}; check "
                "--run-dir (the run directory the experiment ran in)"
            )
        console.print(
            f"no fault ledger at {path}: nothing to revert (an experiment run elsewhere: give "
            "its run directory with --run-dir)",
            soft_wrap=True,
        )
        return 0
    ledger = Ledger(path, create=False)
    if all_:
        entries = ledger.open_faults()
    else:
        known = {e.id: e for e in ledger.entries()}
        unreadable = [i for i in fault_ids if i in ledger.unreadable]
        if unreadable:  # in the ledger, but its row cannot be parsed: say so, not "unknown"
            _report_unreadable(console, ledger, only=unreadable)
            raise LedgerError(
                f"unreadable in the ledger {path}: {', '.join(unreadable)}; nothing was reverted"
            )
        unknown = [i for i in fault_ids if i not in known]
        if unknown:
            raise ConfigError(
                f"not in the ledger {path}: {', '.join(unknown)}; nothing was reverted. "
                f"List the faults with `stormwatch chaos ledger --run-dir {run_dir}`"
            )
        entries = [known[i] for i in fault_ids]

    async def go() -> list[RevertOutcome]:
        async with aiohttp.ClientSession() as session:
            return await revert_entries(ledger, entries, reason="chaos revert", session=session)

    outcomes = asyncio.run(go()) if entries else []
    if not outcomes and not ledger.unreadable:
        console.print("no open faults: nothing to revert")
        return 0
    for outcome in outcomes:
        mark = "[green]reverted[/]" if outcome.ok else "[red]FAILED[/]"
        console.print(f"{mark} {outcome.fault_id}: {outcome.detail}", soft_wrap=True)
    _report_unreadable(console, ledger)
    return 0 if all(o.ok for o in outcomes) and not ledger.unreadable else 1


def _report_unreadable(console: Console, ledger: Ledger, *, only: list[str] | None = None) -> None:
    """Name the ledger rows that could not be read (their faults were not reverted);
    ``only``: just these ids."""
    for fault_id, why in ledger.unreadable.items():
        if only is not None and fault_id not in only:
            continue
        console.print(
            f"[red]UNREADABLE[/] {escape(fault_id)}: {escape(why)}; not reverted. Revert it by "
            "hand if it is still applied, then delete the row: "
            f"sqlite3 {escape(str(ledger.path))} \"DELETE FROM faults WHERE id='{escape(fault_id)}'\"",
            soft_wrap=True,
        )


@click.command("ledger")
@RUN_DIR
@click.option("--open", "only_open", is_flag=True, help="Only faults not reverted yet.")
def ledger_cmd(run_dir: Path, only_open: bool) -> None:
    """List the faults in the ledger (what, where, when, state).

    Faults past their TTL are reverted first; one still open after its TTL (its
    revert failed) is marked OVERDUE. One line per fault; on a terminal narrower
    than 120 columns it shows fault, kind, rank/node, state and age (long ids end
    in "…").
    """
    path = ledger_path(run_dir)
    if not path.exists():
        hint = ""
        demo = ledger_path(_DEMO_RUN_DIR)
        if run_dir == Path("run") and demo.exists():
            hint = f"; the demo's is at {demo}: `stormwatch chaos ledger --run-dir {_DEMO_RUN_DIR}`"
        raise ChaosError(f"no fault ledger at {path}{hint}")
    reap_overdue(run_dir)
    ledger = Ledger(path, create=False)
    entries = ledger.open_faults() if only_open else ledger.entries()
    console = Console()
    console.print(_ledger_table(entries, now=time.time(), width=console.width))
    _report_unreadable(console, ledger)
    if ledger.unreadable:
        raise click.exceptions.Exit(1)


#: From this terminal width on, ``chaos ledger`` also shows where, expires and the full state.
_LEDGER_WIDE_COLUMNS = 120


def _ledger_table(entries: list[LedgerEntry], *, now: float, width: int) -> Table:
    """The ledger as a table with one line per fault at any ``width`` (columns).

    Narrower than :data:`_LEDGER_WIDE_COLUMNS`: fault, kind, rank/node, state (one
    word) and age (since injected, else recorded); wide: also where, expires and the
    state's times, revert reason and last error. Long cells end in "…".
    """
    from stormwatch.tables import Col, one_line_table, short_age

    wide = width >= _LEDGER_WIDE_COLUMNS
    columns = [Col(header="fault", flex=True, min_width=24), Col(header="kind")]
    columns.append(Col(header="rank/node", flex=True, min_width=9))
    if wide:
        columns += [Col(header="where"), Col(header="expires")]
        columns.append(Col(header="state", flex=True, min_width=20))
    else:
        columns += [Col(header="state"), Col(header="age")]
    rows = []
    for e in entries:
        overdue = e.open and e.expires_at <= now
        rank = e.spec.target_rank()
        what = str(rank) if rank is not None else ",".join(e.spec.target_nodes()) or "-"
        if wide:
            where = e.target.node or (f"pid {e.target.pid}" if e.target.pid else "?")
            state: str = e.state
            if e.injected_at:
                state += f", injected {_t(e.injected_at)}"
            if e.reverted_at:
                state += f", reverted {_t(e.reverted_at)} by {e.revert_reason}"
            state = escape(state)
            if overdue:
                state = f"[red]OVERDUE[/] ({state}; TTL passed {_t(e.expires_at)}"
                state += f"; {escape(e.last_error)})" if e.last_error else ")"
            cells = [escape(e.id), e.kind, escape(what), escape(where), _t(e.expires_at), state]
        else:
            state = "[red]OVERDUE[/]" if overdue else e.state
            age = short_age(now - (e.injected_at or e.recorded_at))
            cells = [escape(e.id), e.kind, escape(what), state, age]
        rows.append(cells)
    return one_line_table(columns, rows, width=width)


def _t(at: float | None) -> str:
    return "" if at is None else time.strftime("%H:%M:%S", time.localtime(at))


__all__ = ["ledger_cmd", "revert"]
