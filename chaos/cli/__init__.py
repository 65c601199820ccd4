"""``stormwatch chaos``: validate, run and revert experiments; list the ledger; write post-mortems.

One module per command group: :mod:`.run_commands` (``validate``, ``run``),
:mod:`.suite_command` (``suite``), :mod:`.soak_command` (``soak``), :mod:`.ledger_commands` (``revert``, ``ledger``),
:mod:`.report_commands` (``postmortem``); :mod:`.common` holds the ``--run-dir`` option and
:func:`reap_overdue`, which every command that takes ``--run-dir`` runs first.
"""

from __future__ import annotations

import click

from stormwatch.chaos.cli.common import reap_overdue
from stormwatch.chaos.cli.ledger_commands import ledger_cmd, revert
from stormwatch.chaos.cli.report_commands import postmortem_cmd
from stormwatch.chaos.cli.run_commands import run, validate
from stormwatch.chaos.cli.soak_command import soak
from stormwatch.chaos.cli.suite_command import suite


@click.group("chaos")
def chaos() -> None:
    """Run chaos experiments against the lab or a target file's cluster, and undo their faults.

    An experiment (YAML) has a steady-state hypothesis checked before and after
    a method that injects faults; every fault is written to a durable ledger
    before it is sent, and rolled back however the run ends.

    \b
      stormwatch chaos validate experiments/kill-rank.yaml
      stormwatch chaos run experiments/kill-rank.yaml --run-dir run
      stormwatch chaos run experiments/kill-rank.yaml --dry-run
      stormwatch chaos suite experiments/suite --run-dir run
      stormwatch chaos soak --run-dir run --minutes 30
      stormwatch chaos revert --all --run-dir run
    """


for _command in (validate, run, suite, soak, revert, ledger_cmd, postmortem_cmd):
    chaos.add_command(_command)

__all__ = ["chaos", "reap_overdue"]
