"""Invalid inputs are rejected with errors that name the field; post-mortems map to categories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stormwatch.errors import ConfigError
from stormwatch.faults import FAULT_CATEGORIES
from stormwatch.plan import (
    InvalidPlanInput,
    load_failure_table,
    make_settings,
    read_postmortems,
    resolve_times,
)


def _table(tmp_path: Path, **changes: object) -> Path:
    raw = {
        "source": "test", "gpus": 100, "days": 10, "total": 3,
        "categories": [
            {"id": "software_bug", "name": "Software bug", "count": 1, "hardware": False},
            {"id": "faulty_gpu", "name": "Faulty GPU", "count": 2},
        ],
    }  # fmt: skip
    raw.update(changes)
    path = tmp_path / "rates.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gpus": 0}, "gpus: Input should be greater than 0"),
        ({"gpus": -5}, "gpus: Input should be greater than 0"),
        (
            {"gpus": 8, "checkpoint_write_s": -1.0},
            "checkpoint_write_s: Input should be greater than 0",
        ),
        ({"gpus": 8, "restart_s": -1.0}, "restart_s: Input should be greater than or equal to 0"),
        ({"gpus": 8, "detect_overrides": {"nic": -3.0}}, "detect_overrides.nic: must be"),
        (
            {"gpus": 8, "detect_overrides": {"nic": -3.0}},
            r"^plan settings: detect_overrides\.nic: must be a finite number >= 0 \(got -3\.0\)$",
        ),
        ({"gpus": 8, "bogus": 1}, "bogus: Extra inputs are not permitted"),
    ],
)
def test_invalid_settings_name_the_field(values: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidPlanInput, match=message) as err:
        make_settings(**values)
    assert isinstance(err.value, ConfigError) and err.value.exit_code == 2


def test_negative_rate_in_a_rates_file_is_rejected(tmp_path: Path) -> None:
    path = _table(tmp_path, total=None, categories=[{"id": "cpu", "name": "CPU", "count": -1}])
    with pytest.raises(
        InvalidPlanInput,
        match=r"rates.yaml: categories\.0\.count: Input should be greater than or equal to 0",
    ):
        load_failure_table(path)


def test_total_that_does_not_match_the_counts_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidPlanInput, match="total: 5 but the categories sum to 3"):
        load_failure_table(_table(tmp_path, total=5))


def test_zero_gpus_in_a_rates_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidPlanInput, match="gpus: Input should be greater than 0"):
        load_failure_table(_table(tmp_path, gpus=0))


def test_unknown_category_override_lists_the_valid_ones(tmp_path: Path) -> None:
    table = load_failure_table(_table(tmp_path))
    settings = make_settings(gpus=8, recover_overrides={"gremlins": 10.0})
    with pytest.raises(
        InvalidPlanInput, match="unknown category 'gremlins'; valid: software_bug, faulty_gpu"
    ):
        resolve_times(table, settings)


def test_defaults_and_overrides_resolve_per_category() -> None:
    table = load_failure_table()
    times = resolve_times(table, make_settings(gpus=8, detect_overrides={"faulty_gpu": 5.0}))
    assert times["software_bug"].recover_s == 180.0  # restart only
    assert times["faulty_gpu"].recover_s == 480.0  # restart + replace
    assert times["faulty_gpu"].detect_s == 5.0 and times["faulty_gpu"].source == "flag"
    assert times["nccl_watchdog_timeouts"].detect_s == 600.0  # a hang


def _postmortem(run: Path, name: str, **fields: object) -> None:
    d = run / "experiments" / name
    d.mkdir(parents=True)
    record = {"title": name, "status": "completed", "hypothesis_held": True, "rollbacks_ok": True}
    (d / "postmortem.json").write_text(json.dumps({"experiment_id": name, **record, **fields}))


def test_postmortems_map_fault_kinds_to_categories(tmp_path: Path) -> None:
    _postmortem(
        tmp_path,
        "a",
        fault_kind="kill_rank",
        time_to_detect_seconds=2.0,
        time_to_recover_seconds=14.0,
    )
    _postmortem(
        tmp_path,
        "b",
        fault_kind="kill_rank",
        time_to_detect_seconds=4.0,
        time_to_recover_seconds=20.0,
    )
    _postmortem(
        tmp_path,
        "c",
        fault_kind="freeze_rank",
        time_to_detect_seconds=30.0,
        time_to_recover_seconds=None,
    )
    _postmortem(
        tmp_path,
        "d",
        fault_kind="unplug_moon",
        time_to_detect_seconds=1.0,
        time_to_recover_seconds=2.0,
    )
    measured = read_postmortems(tmp_path)
    assert FAULT_CATEGORIES["kill_rank"] == "software_bug"
    bug = measured.times["software_bug"]
    assert (bug.detect_s, bug.recover_s) == (3.0, 14.0)  # means: detect, recover - detect
    assert set(measured.times) == {"software_bug"}
    assert len(measured.used) == 2 and len(measured.skipped) == 2
    times = resolve_times(load_failure_table(), make_settings(gpus=8), measured.times)
    assert times["software_bug"].source == "measured (2 post-mortems)"


def test_postmortems_dir_without_usable_files_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidPlanInput, match=r"no experiments/\*/postmortem\.json"):
        read_postmortems(tmp_path)
    _postmortem(tmp_path, "x", fault_kind="kill_rank", time_to_detect_seconds=None)
    with pytest.raises(InvalidPlanInput, match="none of the 1 post-mortem"):
        read_postmortems(tmp_path)
    with pytest.raises(InvalidPlanInput, match="is not a directory"):
        read_postmortems(tmp_path / "nope")
