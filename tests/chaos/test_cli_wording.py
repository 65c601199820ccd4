"""What ``chaos run`` and the post-mortem say, in words (no ``None``, no doubled phrases)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from stormwatch.chaos.cli import chaos
from stormwatch.chaos.cli.run_commands import _after_text, _before_text
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.contracts.journal import Journal
from stormwatch.errors import ConfigError


def _journal(**values: object) -> Journal:
    journal = Journal(
        experiment_id="x", title="t", file=Path("x.yaml"), experiment={}, started_at=time.time()
    )
    for key, value in values.items():
        setattr(journal, key, value)
    return journal


def test_the_run_summary_says_why_the_after_phase_was_not_checked() -> None:
    method_failed = _journal(status="failed")
    method_failed.steady_state_before.met = True
    assert _before_text(method_failed) == "held"
    assert _after_text(method_failed) == "not checked (the method failed)"

    before_failed = _journal(status="failed")
    before_failed.steady_state_before.met = False
    assert _after_text(before_failed) == "not checked (the hypothesis did not hold before)"

    no_job = _journal(status="failed")
    assert _before_text(no_job) == "not checked (the job did not start)"

    deviated = _journal(status="deviated")
    deviated.steady_state_before.met, deviated.steady_state_after.met = True, False
    assert _after_text(deviated) == "did NOT hold"


def test_postmortem_of_a_folder_without_a_journal_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "x"
    folder.mkdir()
    result = CliRunner().invoke(chaos, ["postmortem", str(folder)])
    assert isinstance(result.exception, ConfigError)
    message = str(result.exception)
    assert "not an experiment directory (no journal.json)" in message
    assert "lab.json" not in message


def test_postmortem_of_a_missing_folder_names_it_once_and_an_id_where_it_was_looked_up(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "x"
    result = CliRunner().invoke(chaos, ["postmortem", str(missing)])
    assert str(result.exception) == (  # a path: not looked up as an id (it read "(nor <path>)")
        f"EXPERIMENT_DIR {missing}: no such folder; give RUN_DIR/experiments/<id> or an id of "
        "an experiment in --run-dir"
    )
    result = CliRunner().invoke(chaos, ["postmortem", "e1", "--run-dir", str(tmp_path)])
    assert f"EXPERIMENT_DIR e1: no such folder (nor {tmp_path / 'experiments' / 'e1'})" in str(
        result.exception
    )


def test_postmortem_of_a_relative_experiment_dir_finds_its_run_dir_two_folders_up(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """`chaos postmortem .` inside RUN/experiments/e1 looked for the lab in e1 itself
    (breaker's finding): the run dir is taken from the resolved path."""
    run = tmp_path / "run"
    experiment = run / "experiments" / "e1"
    experiment.mkdir(parents=True)
    (experiment / "journal.json").write_text("{}")
    monkeypatch.chdir(experiment)
    for given in (".", "../e1"):
        result = CliRunner().invoke(chaos, ["postmortem", given])
        assert isinstance(result.exception, ConfigError), result.output
        assert f"no lab in {run} " in str(result.exception), str(result.exception)
        # the demo ends with its lab down (fresh-user pass): the files alone still tell
        assert str(result.exception).endswith(
            "; or rewrite the post-mortem from the run's files alone with --offline"
        )


def test_revert_with_a_run_dir_given_as_a_fault_id_points_at_run_dir(tmp_path: Path) -> None:
    both = CliRunner().invoke(chaos, ["revert", "--all", str(tmp_path)])
    assert isinstance(both.exception, ConfigError)
    assert "--all and FAULT_IDS" in str(both.exception)
    assert "--run-dir" in str(both.exception)
    neither = CliRunner().invoke(chaos, ["revert", "--run-dir", str(tmp_path)])
    assert isinstance(neither.exception, ConfigError)
    assert "nothing to revert: give --all or one or more FAULT_IDS" in str(neither.exception)


def test_revert_all_without_a_ledger_says_where_it_looked_and_how_to_point_elsewhere(
    tmp_path: Path,
) -> None:
    """Exit 0 (a clean-up that never ran an experiment relies on it), but a mistyped run
    directory is told how to name the right one (fresh-user pass, 2026-12-06)."""
    result = CliRunner().invoke(chaos, ["revert", "--all", "--run-dir", str(tmp_path / "typo")])
    assert result.exit_code == 0, result.output
    assert f"no fault ledger at {tmp_path / 'typo'}" in result.output
    assert "nothing to revert (an experiment run elsewhere: give its run directory with " in (
        result.output
    )


def test_revert_of_a_fault_id_the_ledger_lacks_is_a_config_error_naming_it(tmp_path: Path) -> None:
    # No ledger at all: a named fault cannot be there (a wrong --run-dir, most likely).
    missing = CliRunner().invoke(chaos, ["revert", "f-1", "--run-dir", str(tmp_path / "nope")])
    assert isinstance(missing.exception, ConfigError)
    assert "no fault ledger at" in str(missing.exception) and "f-1" in str(missing.exception)
    assert not (tmp_path / "nope").exists()
    # A ledger without those faults: name them and where to list the real ones.
    path = ledger_path(tmp_path)
    path.parent.mkdir(parents=True)
    Ledger(path)
    unknown = CliRunner().invoke(chaos, ["revert", "f-1", "f-2", "--run-dir", str(tmp_path)])
    assert isinstance(unknown.exception, ConfigError)
    assert "not in the ledger" in str(unknown.exception)
    assert "f-1, f-2; nothing was reverted" in str(unknown.exception)
    assert "stormwatch chaos ledger --run-dir" in str(unknown.exception)
