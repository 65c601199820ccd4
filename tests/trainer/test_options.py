"""`stormwatch train`'s options are declared once, on the config fields, and derived from there."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import click
import pytest

from stormwatch.trainer import cli
from stormwatch.trainer.config import ProgressConfig, TrainConfig
from stormwatch.trainer.config.options import (
    FIELD_DEFAULT,
    click_options,
    declared,
    folder_defaults,
    option,
)


def _with_nested(config: type) -> list[type]:
    """``config`` and the config classes of its fields, recursively (``TrainConfig.model`` ...)."""
    hints = typing.get_type_hints(config)
    nested = [hints[f.name] for f in dataclasses.fields(config)]
    return [
        config,
        *(c for kind in nested if dataclasses.is_dataclass(kind) for c in _with_nested(kind)),
    ]


#: What ``stormwatch train`` derives its options from.
CONFIGS = (*_with_nested(TrainConfig), ProgressConfig)
#: Fields no flag sets, each for a stated reason (see the configs' docstrings).
WITHOUT_OPTION = {
    "ModelConfig.d_ff",  # 0: 4 x d_model
    "ModelConfig.max_seq_len",  # set to --seq-len
    "OptimConfig.weight_decay",
    "TelemetryConfig.count_collectives",  # the benchmark's bare baseline only
}
#: Options whose command-line default differs from the field's, on purpose.
CLI_DEFAULTS = {"steps": 30, "dp": None}  # steps: required in Python; dp: auto


@pytest.fixture(autouse=True)
def _no_option_variables(monkeypatch):
    for item in (i for config in CONFIGS for i in declared(config)):
        if item.option.envvar is not None:
            monkeypatch.delenv(item.option.envvar, raising=False)


def _params() -> dict[str, click.Parameter]:
    return {param.name: param for param in cli.train.params if param.name is not None}


def _context(args: list[str]) -> click.Context:
    return cli.train.make_context("train", args)


def test_every_field_of_each_config_has_an_option_but_the_few_without_one():
    without = set()
    for config in CONFIGS:
        hints = typing.get_type_hints(config)
        options = {item.field.name for item in declared(config)}
        for item in dataclasses.fields(config):
            if item.name not in options and not dataclasses.is_dataclass(hints[item.name]):
                without.add(f"{config.__name__}.{item.name}")
    assert without == WITHOUT_OPTION


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_every_option_of_each_config_has_a_flag_help_and_default(config):
    params = _params()
    for item in declared(config):
        param = params[item.option.name]
        assert param.opts[0] == item.option.flags[0] and param.opts[0].startswith("--")
        assert item.option.help.endswith(".") and param.help.startswith(item.option.help)
        assert item.default is param.default or item.default == param.default


def test_command_line_defaults_equal_the_dataclass_defaults():
    params = _params()
    for config in CONFIGS:
        for item in declared(config):
            name = item.option.name
            if name in CLI_DEFAULTS:
                assert item.option.cli_default == params[name].default == CLI_DEFAULTS[name]
                continue
            assert item.option.cli_default is FIELD_DEFAULT, name
            assert params[name].default == item.field.default, name
    assert set(params) == {item.option.name for c in CONFIGS for item in declared(c)}


def test_the_default_command_line_builds_the_default_config():
    values = folder_defaults(TrainConfig, _context([]).params)
    values["dp"] = 1
    assert cli._config(values) == TrainConfig(steps=30)


def test_every_option_value_reaches_its_config_field():
    args = ["--steps", "7", "--seq-len", "32", "--lr", "0.01", "--keep", "5", "--job", "j"]
    args += ["--checkpoint-mode", "async", "--trace-flush-timeout", "3", "--dropout", "0"]
    values = folder_defaults(TrainConfig, _context(args).params)
    values["dp"] = 1
    config = cli._config(values)
    assert (config.steps, config.data.seq_len, config.model.max_seq_len) == (7, 32, 32)
    assert (config.optim.lr, config.checkpoint.keep, config.checkpoint.mode) == (0.01, 5, "async")
    assert (config.telemetry.job, config.tracing.flush_timeout, config.model.dropout) == (
        "j",
        3.0,
        0.0,
    )


@pytest.mark.parametrize(
    ("variable", "name", "value", "parsed"),
    [
        ("STORMWATCH_JOB", "job", "from-env", "from-env"),
        ("STORMWATCH_METRICS_DIR", "metrics_dir", "/tmp/m", Path("/tmp/m")),
        ("STORMWATCH_CONTROL_DIR", "control_dir", "/tmp/c", Path("/tmp/c")),
        ("STORMWATCH_OTLP_ENDPOINT", "otlp_endpoint", "http://env:4318/v1/traces", None),
    ],
)
def test_environment_variables_set_their_options_and_a_flag_wins(
    monkeypatch, variable, name, value, parsed
):
    monkeypatch.setenv(variable, value)
    expected = value if parsed is None else parsed
    assert _context([]).params[name] == expected
    param = _params()[name]
    assert _context([param.opts[0], "http://flag:1"]).params[name] != expected
    assert f"env: {variable}]" in (param.help or "")


def test_a_folder_left_unset_defaults_under_the_folder_it_is_declared_under(tmp_path):
    values = folder_defaults(
        TrainConfig, _context(["--log-dir", str(tmp_path), "--spans-dir", "elsewhere"]).params
    )
    assert values["dump_dir"] == tmp_path / "dumps"
    assert values["spans_dir"] == Path("elsewhere")
    assert values["control_dir"] is None  # no --metrics-dir: the control channel is off
    help_text = _params()["control_dir"].help or ""
    assert help_text.endswith("[default: <metrics-dir>/control; env: STORMWATCH_CONTROL_DIR]")


@pytest.mark.parametrize(
    "args",
    [
        ["--checkpoint-failures-allowed", "1001"],
        ["--checkpoint-mode", "lazy"],
        ["--pp-schedule", "Interleaved1F1B"],
        ["--steps", "many"],
        ["--dp", "0"],
    ],
)
def test_the_parser_checks_declared_types_choices_and_bounds(args):
    with pytest.raises(click.BadParameter):
        _context(args)


def test_an_option_without_any_default_is_a_declaration_error():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Broken:
        size: int = option("--size", help="A size.")

    with pytest.raises(TypeError, match=r"Broken\.size: an option needs a default"):
        click_options(Broken)


def test_two_declarations_of_one_option_are_a_declaration_error():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Twice:
        steps: int = option("--steps", default=1, help="Steps.")

    with pytest.raises(TypeError, match="both declare the option 'steps'"):
        click_options(TrainConfig, Twice)
